"""What crosses a socket: the data plane's batches and the control plane's messages.

`codec.py` frames a batch (a msgpack header, one raw frame per tensor, nothing pickled),
`channels.py` holds the PUSH/PULL sockets, `control.py` the controller's and workers' control
sockets, `messages.py` and `commands.py` a class per thing a worker says or is told,
`weight_update.py` the typed weight update they carry, and `security.py` who may connect.

May import: areal.graph (and the leaves areal.config, areal.overrides, areal.errors).
"""
