//! A stack of the trace symbolized, merged with its Python stack, and its call site picked out.

use serde::Serialize;

use super::native::{Frame, TraceSymbolizer};
use super::python;
use super::sites::site_index;
use crate::model::autograd::BORROWED;
use crate::model::Trace;

/// A symbolized stack with its call site picked out.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Located {
    pub site: Frame,
    /// The whole stack, innermost first, inlined frames expanded.
    pub frames: Vec<Frame>,
    /// Where `site` is in `frames`; terminal output shows frames from here.
    #[serde(skip)]
    pub site_index: usize,
    /// In a Python process, the name of a thread without Python frames (a native worker
    /// thread such as PyTorch's autograd engine) that made the allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The framework op that allocated, from the native frames (`aten::mm`, `MmBackward0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// The Python frames are those of another thread waiting in `backward()` (see
    /// `autograd`): the allocation was made for that call.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub during_backward: bool,
}

/// Symbolizes the stack with key `stack` (0 or unknown: an empty stack), merged with its
/// Python stack when it has one (see [`super::python::merge`]).
pub fn locate(trace: &Trace, sym: &mut TraceSymbolizer, stack: u32) -> Located {
    let (native, py) = match trace.combined.get(&stack) {
        Some(&(n, p)) => (n, p),
        None => (stack, 0),
    };
    let during_backward = py & BORROWED != 0;
    let py = py & !BORROWED;
    let mut frames = trace
        .stacks
        .get(&native)
        .map(|a| sym.stack(a))
        .unwrap_or_default();
    let op = super::sites::op_name(&frames);
    if let Some(pf) = trace.py_stacks.get(&py) {
        let python: Vec<_> = pf.iter().map(|f| python::frame(trace.py_codes.get(&f.code), f)).collect();
        let entry: Vec<bool> = pf.iter().map(|f| f.flags & 1 != 0).collect();
        frames = python::merge(frames, python, &entry);
    }
    let site_index = match frames.iter().position(|f| f.python) {
        Some(first) => frames
            .iter()
            .position(|f| f.python && python::is_user_code(f))
            .unwrap_or(first),
        None => site_index(&frames),
    };
    // A thread of a Python process that allocated outside Python code (PyTorch's autograd
    // threads have a thread state but no frames).
    let thread = match trace.stack_tid.get(&stack).and_then(|t| trace.threads.get(t)) {
        Some(t) if (py == 0 || during_backward) && !trace.py_codes.is_empty() => Some(t.name.clone()),
        _ => None,
    };
    Located {
        site: frames.get(site_index).cloned().unwrap_or_default(),
        frames,
        site_index,
        thread,
        op,
        during_backward,
    }
}
