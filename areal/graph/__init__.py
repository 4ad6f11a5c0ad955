"""Declaring: nodes, typed ports, the graph and its validation, recipe loading.

May import: no other part of areal but the leaves areal.config, areal.overrides, areal.errors.
"""

from areal.graph.batch import Batch, Ragged
from areal.graph.graph import ControlEdge, Edge, Graph
from areal.graph.node import Node, NodeSpec, StatefulNode, node
from areal.graph.ports import Bool, Double, Float, Int, Int32, Json, PortType

__all__ = [
    "Batch", "Bool", "ControlEdge", "Double", "Edge", "Float", "Graph", "Int", "Int32", "Json",
    "Node", "NodeSpec", "PortType", "Ragged", "StatefulNode", "node",
]
