//! Aggregate mode's attribution off the Python thread, as the reader makes it for a full trace
//! (tools/src/model/autograd.rs, kept alike): PyTorch runs `backward()` on its own device
//! threads while the Python thread that called it waits. While a thread's latest Python stack is
//! inside backward, allocations of threads without Python frames borrow that stack (its id with
//! `BORROWED` set), so a site names the `loss.backward()` line as well as the op. In aggregate
//! mode the writer must do it: the reader no longer sees the events in order. Depends on nothing
//! in the crate.

use rustc_hash::{FxHashMap, FxHashSet};

/// Set in a Python stack id an allocation borrowed (the reader's `autograd::BORROWED`).
pub const BORROWED: u32 = 0x8000_0000;

#[derive(Default)]
pub struct Backward {
    /// PyCode ids of torch's backward entry points.
    codes: FxHashSet<u32>,
    /// Whether each PyStack id runs through one of them.
    stacks: FxHashMap<u32, bool>,
    /// Threads whose latest Python stack is inside backward, with that stack, oldest first.
    waiting: Vec<(u32, u32)>,
}

impl Backward {
    /// A code object described to the trace as PyCode `id`.
    pub fn code(&mut self, id: u32, name: &str, filename: &str) {
        let torch_file = filename.contains("torch/autograd/") || filename.ends_with("torch/_tensor.py");
        if name == "_engine_run_backward" || (torch_file && matches!(name, "backward" | "grad")) {
            self.codes.insert(id);
        }
    }

    /// A Python stack written as PyStack `id`, its frames' code ids.
    pub fn stack(&mut self, id: u32, mut codes: impl Iterator<Item = u32>) {
        let inside = codes.any(|c| self.codes.contains(&c));
        self.stacks.insert(id, inside);
    }

    /// The Python stack an event of `tid` is attributed to: its own, one borrowed, or 0.
    /// `python`: the thread was running Python code (event flag bit 0).
    pub fn attribute(&mut self, tid: u32, pystack: u32, python: bool, is_alloc: bool) -> u32 {
        if pystack != 0 {
            self.waiting.retain(|&(t, _)| t != tid);
            if self.stacks.get(&pystack).copied().unwrap_or(false) {
                self.waiting.push((tid, pystack));
            }
            return pystack;
        }
        if !is_alloc || python {
            return 0;
        }
        self.waiting.iter().rev().find(|&&(t, _)| t != tid).map_or(0, |&(_, py)| py | BORROWED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_without_python_borrow_the_stack_of_a_thread_waiting_in_backward() {
        let mut b = Backward::default();
        b.code(1, "train", "/app/train.py");
        b.code(2, "backward", "/x/site-packages/torch/_tensor.py");
        b.stack(7, [1].into_iter());
        b.stack(8, [2, 1].into_iter());
        assert_eq!(b.attribute(9, 0, false, true), 0, "nobody is in backward yet");
        assert_eq!(b.attribute(1, 7, true, true), 7);
        assert_eq!(b.attribute(1, 8, true, true), 8, "main thread enters backward");
        assert_eq!(b.attribute(9, 0, false, true), 8 | BORROWED);
        assert_eq!(b.attribute(9, 0, false, false), 0, "frees borrow nothing");
        assert_eq!(b.attribute(1, 0, false, true), 0, "not from itself");
        assert_eq!(b.attribute(1, 7, true, true), 7, "backward returned");
        assert_eq!(b.attribute(9, 0, false, true), 0);
    }
}
