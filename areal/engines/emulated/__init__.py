"""Engines on an emulated device: the generation and training Protocols in the modelled time of a
device profile (`profiles/`), computing nothing, so the runtime can be driven at scale on a laptop.
Part of the engines layer, not a layer of its own.
"""
