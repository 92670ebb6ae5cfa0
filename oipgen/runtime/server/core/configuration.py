"""The model configuration extension: Triton's `ModelConfig` of a model, derived from its declarations."""

from __future__ import annotations

from ... import datatypes
from ...grpc import model_config_pb2 as pb_config
from ..model import Model, TensorSpec

__all__ = ["model_config"]


def model_config(model: Model, instances: int = 1) -> pb_config.ModelConfig:
    """Triton's model configuration of `model`, from its declarations. Tensor `dims` exclude the batch dimension
    of a model that batches (as declared); every declared version is served (`version_policy: all`); the model
    runs through the Python model API (`backend: python`) as `instances` CPU instances (`DataPlane.instances`)."""
    config = pb_config.ModelConfig(
        name=model.name,
        platform=model.platform,
        backend="python",
        version_policy=pb_config.ModelVersionPolicy(all=pb_config.ModelVersionPolicy.All()),
        max_batch_size=model.max_batch_size,
        input=[
            pb_config.ModelInput(name=spec.name, data_type=_config_type(spec), dims=spec.shape)
            for spec in model.inputs
        ],
        output=[
            pb_config.ModelOutput(name=spec.name, data_type=_config_type(spec), dims=spec.shape)
            for spec in model.outputs
        ],
        instance_group=[
            pb_config.ModelInstanceGroup(
                name=f"{model.name}_0", kind=pb_config.ModelInstanceGroup.Kind.KIND_CPU, count=instances
            )
        ],
        model_transaction_policy=pb_config.ModelTransactionPolicy(decoupled=model.decoupled),
    )
    batching = model.dynamic_batching
    if batching is not None:
        config.dynamic_batching.CopyFrom(
            pb_config.ModelDynamicBatching(
                preferred_batch_size=batching.preferred_batch_size,
                max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
            )
        )
    return config


def _config_type(spec: TensorSpec) -> str:
    """The `inference.DataType` value name of the tensor's datatype ("TYPE_FP32"; BYTES is "TYPE_STRING")."""
    return datatypes.BY_NAME[spec.datatype].model_config
