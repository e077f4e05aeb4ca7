//! `--module NAME`: which stacks have a frame in a module whose file name contains `NAME`,
//! native frames by the module map, Python frames by their code object's file name.

use gpumemtrace_format::{Module, PyCode, PyStack, Stack};
use rustc_hash::{FxHashMap, FxHashSet};

/// Set in a Python stack id an event borrowed from another thread (`model::autograd`).
const BORROWED: u32 = 0x8000_0000;

pub struct StackMatch {
    name: String,
    /// Address ranges of the matching modules.
    ranges: Vec<(u64, u64)>,
    /// Native stacks not judged yet (a Module record may follow the stack that needs it).
    pending: FxHashMap<u32, Vec<u64>>,
    native: FxHashMap<u32, bool>,
    codes: FxHashSet<u32>,
    python: FxHashSet<u32>,
    /// Keys the model gave (native stack, Python stack) pairs: key -> native stack id.
    pairs: FxHashMap<u32, u32>,
}

impl StackMatch {
    pub fn new(name: &str) -> StackMatch {
        StackMatch {
            name: name.to_owned(),
            ranges: Vec::new(),
            pending: FxHashMap::default(),
            native: FxHashMap::default(),
            codes: FxHashSet::default(),
            python: FxHashSet::default(),
            pairs: FxHashMap::default(),
        }
    }

    fn matches(&self, path: &str) -> bool {
        path.rsplit('/').next().unwrap_or(path).contains(&self.name)
    }

    pub fn module(&mut self, m: &Module) {
        if self.matches(&m.path) {
            self.ranges.push((m.start, m.end));
            // Stacks judged before this module was known may have frames in it.
            self.native.retain(|_, v| *v);
        }
    }

    pub fn stack(&mut self, s: &Stack) {
        self.pending.insert(s.id, s.frames.clone());
    }

    pub fn py_code(&mut self, c: &PyCode) {
        if self.matches(&c.filename) {
            self.codes.insert(c.id);
        }
    }

    pub fn py_stack(&mut self, s: &PyStack) {
        if s.frames.iter().any(|f| self.codes.contains(&f.code)) {
            self.python.insert(s.id);
        }
    }

    /// Stack key `key` stands for the native stack `native` and a Python stack.
    pub fn pair(&mut self, key: u32, native: u32) {
        if key != native {
            self.pairs.insert(key, native);
        }
    }

    /// Whether an event of stack key `stack` and Python stack `pystack` has a matching frame.
    pub fn admits(&mut self, stack: u32, pystack: u32) -> bool {
        if pystack != 0 && self.python.contains(&(pystack & !BORROWED)) {
            return true;
        }
        let native = self.pairs.get(&stack).copied().unwrap_or(stack);
        if let Some(&v) = self.native.get(&native) {
            return v;
        }
        let frames = match self.pending.get(&native) {
            Some(f) => f,
            None => return false,
        };
        let v = frames.iter().any(|&a| self.ranges.iter().any(|&(lo, hi)| a >= lo && a < hi));
        // Keep the frames while the verdict is no: a module that arrives later may change it.
        if v {
            self.pending.remove(&native);
        }
        self.native.insert(native, v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemtrace_format::PyFrame;

    fn module(path: &str, start: u64, end: u64) -> Module {
        Module { path: path.into(), start, end, ..Module::default() }
    }

    #[test]
    fn a_stack_matches_by_a_native_frame_in_the_module_or_a_python_frame_in_the_file() {
        let mut m = StackMatch::new("libfoo");
        m.module(&module("/opt/lib/libbar.so", 0x1000, 0x2000));
        m.stack(&Stack { id: 1, frames: vec![0x1500, 0x3500] });
        m.stack(&Stack { id: 2, frames: vec![0x1500] });
        // libfoo is not known yet: stack 1 does not match...
        assert!(!m.admits(1, 0));
        // ...until its module arrives (loaded after the stack was first seen).
        m.module(&module("/opt/lib/libfoo.so.2", 0x3000, 0x4000));
        assert!(m.admits(1, 0));
        assert!(!m.admits(2, 0));
        // The directory is not the file name.
        let mut d = StackMatch::new("opt");
        d.module(&module("/opt/lib/libbar.so", 0x1000, 0x2000));
        d.stack(&Stack { id: 2, frames: vec![0x1500] });
        assert!(!d.admits(2, 0));

        // Python frames by their code's file; a key standing for (native 2, Python 7).
        let mut p = StackMatch::new("train.py");
        p.py_code(&PyCode { id: 3, filename: "/home/u/train.py".into(), ..PyCode::default() });
        p.py_code(&PyCode { id: 4, filename: "/usr/lib/python3.12/x.py".into(), ..PyCode::default() });
        p.py_stack(&PyStack { id: 7, frames: vec![PyFrame { code: 4, ..PyFrame::default() }, PyFrame { code: 3, ..PyFrame::default() }] });
        p.py_stack(&PyStack { id: 8, frames: vec![PyFrame { code: 4, ..PyFrame::default() }] });
        p.stack(&Stack { id: 2, frames: vec![0x1500] });
        p.pair(0x8000_0000, 2);
        assert!(p.admits(0x8000_0000, 7));
        assert!(p.admits(0x8000_0001, 7 | BORROWED), "a borrowed Python stack counts");
        assert!(!p.admits(0x8000_0002, 8));
        assert!(!p.admits(2, 0));
    }
}
