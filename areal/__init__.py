"""areal: fully asynchronous RL for reasoning models, declared as a dataflow graph."""

from areal.config import RunConfig
from areal.graph import Batch, Bool, Double, Float, Graph, Int, Int32, Json, Ragged, node

__all__ = ["Batch", "Bool", "Double", "Float", "Graph", "Int", "Int32", "Json", "Ragged", "RunConfig", "node"]
__version__ = "0.1.0"
