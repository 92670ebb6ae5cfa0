"""The server's processes: the command line (`main`), one server process (`serve`: the composition root,
`Assembly`, and the process's life), `--workers N` under one supervisor (`supervisor`, handed what each worker
runs; it restarts a worker that stops answering) and the workers' shared control plane (`cluster`: calls between
workers over authenticated Unix sockets, each with its deadline), the operating system's parts (`sockets`: bound
sockets, the ports file, signals; `allocator`).

It imports every other wing; nothing imports it but the package's `__main__`. Nothing here is rendered.
"""
