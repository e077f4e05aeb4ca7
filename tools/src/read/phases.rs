//! Phases as the replay goes: the ranges open on each thread (`gpumemtrace_push/pop`, NVTX),
//! the process's current mark, and the spans they made. Spans are capped at [`MAX_SPANS`].

use std::collections::HashMap;

use gpumemtrace_format::{Phase, PhaseOp};
use rustc_hash::FxHashMap;

/// Phase spans kept at most (more are counted).
pub const MAX_SPANS: usize = 20_000;

/// A stretch of the run with a name: a closed push/pop range, or the time from one mark to
/// the next (`tid` 0, depth 0).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PhaseSpan {
    pub name: String,
    pub tid: u32,
    /// Nesting depth on its thread (0 = outermost); marks are 0.
    pub depth: u32,
    pub mark: bool,
    pub start_ns: u64,
    pub end_ns: u64,
}

#[derive(Default)]
pub struct Phases {
    names: Vec<String>,
    index: HashMap<String, u32>,
    /// Open ranges per thread: name id, start.
    threads: FxHashMap<u32, Vec<(u32, u64)>>,
    mark: Option<(u32, u64)>,
    /// Keep the spans (the first pass); a replay that only takes snapshots does not.
    keep_spans: bool,
    spans: Vec<PhaseSpan>,
    spans_omitted: u64,
}

impl Phases {
    pub fn new(keep_spans: bool) -> Phases {
        Phases { keep_spans, ..Phases::default() }
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.names.push(name.to_owned());
        let i = self.names.len() as u32 - 1;
        self.index.insert(name.to_owned(), i);
        i
    }

    fn span(&mut self, name: u32, tid: u32, depth: u32, mark: bool, start: u64, end: u64) {
        if !self.keep_spans {
            return;
        }
        if self.spans.len() >= MAX_SPANS {
            self.spans_omitted += 1;
            return;
        }
        let name = self.names[name as usize].clone();
        self.spans.push(PhaseSpan { name, tid, depth, mark, start_ns: start, end_ns: end });
    }

    /// Applies a Phase record.
    pub fn apply(&mut self, p: &Phase) {
        match p.op {
            PhaseOp::Push => {
                let id = self.intern(&p.name);
                self.threads.entry(p.tid).or_default().push((id, p.time_ns));
            }
            PhaseOp::Pop => {
                let stack = self.threads.entry(p.tid).or_default();
                // A pop without a push (the range opened before tracing) closes nothing.
                if let Some((id, start)) = stack.pop() {
                    let depth = stack.len() as u32;
                    self.span(id, p.tid, depth, false, start, p.time_ns);
                }
            }
            PhaseOp::Mark => {
                let id = self.intern(&p.name);
                if let Some((old, start)) = self.mark.replace((id, p.time_ns)) {
                    self.span(old, 0, 0, true, start, p.time_ns);
                }
            }
        }
    }

    /// The phase of an event on thread `tid` now: its innermost open range, else the mark.
    pub fn current(&self, tid: u32) -> Option<u32> {
        match self.threads.get(&tid).and_then(|s| s.last()) {
            Some(&(id, _)) => Some(id),
            None => self.mark.map(|(id, _)| id),
        }
    }

    /// Whether `want` is open on thread `tid` (innermost or enclosing), or, on a thread with no
    /// open range, is the process mark.
    pub fn in_phase(&self, tid: u32, want: &str) -> bool {
        let Some(&id) = self.index.get(want) else {
            return false;
        };
        match self.threads.get(&tid).filter(|s| !s.is_empty()) {
            Some(s) => s.iter().any(|&(n, _)| n == id),
            None => self.mark.is_some_and(|(n, _)| n == id),
        }
    }

    pub fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// Every phase name seen, by id.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Closes the spans still open at `end_ns`; returns the spans in time order and how many
    /// were left out.
    pub fn finish(&mut self, end_ns: u64) -> (Vec<PhaseSpan>, u64) {
        if let Some((id, start)) = self.mark.take() {
            self.span(id, 0, 0, true, start, end_ns);
        }
        let mut open: Vec<(u32, Vec<(u32, u64)>)> = self.threads.drain().collect();
        open.sort_by_key(|(tid, _)| *tid);
        for (tid, stack) in open {
            for (depth, (id, start)) in stack.into_iter().enumerate() {
                self.span(id, tid, depth as u32, false, start, end_ns);
            }
        }
        let mut spans = std::mem::take(&mut self.spans);
        spans.sort_by_key(|a| (a.start_ns, a.depth, a.tid));
        (spans, self.spans_omitted)
    }
}
