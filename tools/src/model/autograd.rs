//! Attribution off the Python thread. PyTorch runs `backward()` for CUDA tensors on its own
//! device threads while the Python thread that called it waits; their blocks have no Python
//! stack of their own. When a Python thread's latest stack is inside torch's backward (its
//! frames include `_engine_run_backward`, or `backward`/`grad` of `torch/autograd` or
//! `torch/_tensor.py`), allocations made meanwhile by threads without Python frames borrow
//! that stack: the report names the `loss.backward()` line as well as the op.

use std::collections::HashMap;

use gpumemtrace_format::{event_flags, Event, PyCode, PyFrame};
use rustc_hash::FxHashMap;

/// Set in a Python stack id that an event borrowed from a thread waiting in `backward()`.
pub const BORROWED: u32 = 0x8000_0000;

#[derive(Default)]
pub struct Backward {
    in_backward: FxHashMap<u32, bool>,
    /// Threads whose latest Python stack is inside backward, with that stack, oldest first.
    waiting: Vec<(u32, u32)>,
}

impl Backward {
    /// The Python stack id `e` is attributed to: its own, one borrowed (with [`BORROWED`] set),
    /// or 0.
    pub fn attribute(
        &mut self,
        e: &Event,
        is_alloc: bool,
        codes: &HashMap<u32, PyCode>,
        stacks: &HashMap<u32, Vec<PyFrame>>,
    ) -> u32 {
        if e.pystack != 0 {
            let inside =
                *self.in_backward.entry(e.pystack).or_insert_with(|| in_backward(stacks.get(&e.pystack), codes));
            self.waiting.retain(|&(t, _)| t != e.tid);
            if inside {
                self.waiting.push((e.tid, e.pystack));
            }
            return e.pystack;
        }
        if !is_alloc || e.flags & event_flags::PYTHON != 0 {
            return 0;
        }
        match self.waiting.iter().rev().find(|&&(t, _)| t != e.tid) {
            Some(&(_, py)) => py | BORROWED,
            None => 0,
        }
    }
}

fn in_backward(frames: Option<&Vec<PyFrame>>, codes: &HashMap<u32, PyCode>) -> bool {
    frames.into_iter().flatten().filter_map(|f| codes.get(&f.code)).any(|c| {
        let torch_file = c.filename.contains("torch/autograd/") || c.filename.ends_with("torch/_tensor.py");
        c.name == "_engine_run_backward" || (torch_file && matches!(c.name.as_str(), "backward" | "grad"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_without_python_borrow_the_stack_of_a_thread_waiting_in_backward() {
        let codes: HashMap<u32, PyCode> = [
            (1, PyCode { name: "train".into(), filename: "/app/train.py".into(), ..PyCode::default() }),
            (2, PyCode { name: "backward".into(), filename: "/x/site-packages/torch/_tensor.py".into(), ..PyCode::default() }),
        ]
        .into();
        let stacks: HashMap<u32, Vec<PyFrame>> = [
            (7, vec![PyFrame { code: 1, ..PyFrame::default() }]),
            (8, vec![PyFrame { code: 2, ..PyFrame::default() }, PyFrame { code: 1, ..PyFrame::default() }]),
        ]
        .into();
        let ev = |tid, pystack| Event { tid, pystack, ..Event::default() };
        let mut b = Backward::default();
        assert_eq!(b.attribute(&ev(9, 0), true, &codes, &stacks), 0, "nobody is in backward yet");
        assert_eq!(b.attribute(&ev(1, 7), true, &codes, &stacks), 7);
        assert_eq!(b.attribute(&ev(9, 0), true, &codes, &stacks), 0);
        assert_eq!(b.attribute(&ev(1, 8), true, &codes, &stacks), 8, "main thread enters backward");
        assert_eq!(b.attribute(&ev(9, 0), true, &codes, &stacks), 8 | BORROWED);
        assert_eq!(b.attribute(&ev(9, 0), false, &codes, &stacks), 0, "frees borrow nothing");
        assert_eq!(b.attribute(&ev(1, 0), true, &codes, &stacks), 0, "not from itself");
        assert_eq!(b.attribute(&ev(1, 7), true, &codes, &stacks), 7, "backward returned");
        assert_eq!(b.attribute(&ev(9, 0), true, &codes, &stacks), 0);
    }
}
