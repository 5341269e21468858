//! The graph family: `GraphBuilder` (a graph recorded by stream capture, whose fills and copies
//! retain the buffers they touch) and `Graph` (its executable form), over
//! `memory::GraphBuilder` / `memory::Graph` / `memory::GraphExec`; both have `retain(buffer)`
//! for work custody does not see (a kernel that CuPy, PyTorch or Numba launched on the
//! captured stream).
//!
//! The modules, lowest first (pybind/DESIGN.md, "Module order"):
//!
//! - `class`: `GraphBuilder`'s struct, which streams, buffers and resources name (a stream
//!   argument may be a builder), with its constructor and accessors.
//! - `methods`: `GraphBuilder`'s methods, `Graph`, and a graph allocation's buffer.

pub(crate) mod class;
pub(crate) mod methods;

use pyo3::prelude::*;

use class::PyGraphBuilder;
use methods::{_create_graph_builder, PyGraph};

/// Registers the graph classes on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    add_classes!(m, [PyGraphBuilder, PyGraph]);
    m.add_function(wrap_pyfunction!(_create_graph_builder, m)?)?;
    Ok(())
}
