"""What observes the server: every inference request and model run reported to observers (`events`: the
`Observer` interface, the `Timer`, the records, and the composite `Observers`), which are made in one place
(`observing`): the statistics extension (`statistics`), the Prometheus metrics (`metrics`, and the metrics of
model code, `model_metrics`), OpenTelemetry traces (`tracing`; configured from the environment by
`tracing_setup`; spans encoded by `otlp`, sent by `otlp_http`); and the logs (`logs`: the format, the request a line
belongs to; `access_log`: one line per answered request, over both transports).

It imports only the server's vocabulary (`errors`, `types`, `settings`) and the package's protobuf messages.
Nothing here is rendered.
"""
