//! Phases as the replay goes: the ranges open on each thread (`gpumemtrace_push/pop`, NVTX),
//! the process's current mark, and the spans they made. Spans are kept to at most
//! [`MAX_SPANS`]: past that, neighbours of one name, thread and depth closer than a quantum
//! (which doubles as needed) become one span standing for several, so a long run's phases stay
//! visible from start to end instead of the later ones being dropped.

use std::collections::HashMap;

use gpumemtrace_format::{Phase, PhaseOp};
use rustc_hash::FxHashMap;

/// Phase spans kept at most (more are merged).
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
    /// How many spans of the run this one stands for (1, unless neighbours were merged).
    pub count: u64,
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
    /// Spans of one name, thread and depth at most this far apart have been merged.
    quantum_ns: u64,
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
            self.compact();
        }
        let name = self.names[name as usize].clone();
        self.spans.push(PhaseSpan { name, tid, depth, mark, start_ns: start, end_ns: end, count: 1 });
    }

    /// Merges neighbours (same name, thread, depth and kind) until at most half of
    /// [`MAX_SPANS`] are left, doubling the gap that counts as near each round.
    fn compact(&mut self) {
        let lo = self.spans.iter().map(|s| s.start_ns).min().unwrap_or(0);
        let hi = self.spans.iter().map(|s| s.end_ns).max().unwrap_or(0);
        let mut quantum = self.quantum_ns.max((hi - lo) / (MAX_SPANS as u64 / 4)).max(1);
        self.spans.sort_by(|a, b| (a.mark, a.tid, a.depth, &a.name, a.start_ns).cmp(&(b.mark, b.tid, b.depth, &b.name, b.start_ns)));
        loop {
            let mut out: Vec<PhaseSpan> = Vec::with_capacity(self.spans.len());
            for s in self.spans.drain(..) {
                match out.last_mut() {
                    Some(l)
                        if (l.mark, l.tid, l.depth) == (s.mark, s.tid, s.depth)
                            && l.name == s.name
                            && s.start_ns <= l.end_ns.saturating_add(quantum) =>
                    {
                        l.end_ns = l.end_ns.max(s.end_ns);
                        l.count += s.count;
                    }
                    _ => out.push(s),
                }
            }
            self.spans = out;
            if self.spans.len() <= MAX_SPANS / 2 {
                break;
            }
            quantum = quantum.saturating_mul(2);
        }
        self.quantum_ns = quantum;
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

    /// Closes the spans still open at `end_ns`; returns the spans in time order and the gap
    /// below which neighbours were merged (0: none were).
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
        (spans, self.quantum_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(p: &mut Phases, name: &str, tid: u32, start: u64, end: u64) {
        p.apply(&Phase { op: PhaseOp::Push, name: name.into(), tid, time_ns: start });
        p.apply(&Phase { op: PhaseOp::Pop, name: name.into(), tid, time_ns: end });
    }

    /// 100000 steps of forward then backward: more spans than are kept. Neighbours merge; no
    /// phase vanishes, the run is covered to its end, and every span is counted.
    #[test]
    fn past_the_cap_spans_merge_with_their_neighbours_instead_of_vanishing() {
        let mut p = Phases::new(true);
        p.apply(&Phase { op: PhaseOp::Mark, name: "epoch".into(), tid: 1, time_ns: 0 });
        for i in 0..100_000u64 {
            let t = i * 1000;
            range(&mut p, "forward", 1, t, t + 400);
            range(&mut p, "backward", 1, t + 500, t + 900);
        }
        let (spans, quantum) = p.finish(100_000 * 1000);
        assert!(spans.len() <= MAX_SPANS && quantum > 0, "{} spans", spans.len());
        for name in ["forward", "backward"] {
            let of: Vec<&PhaseSpan> = spans.iter().filter(|s| s.name == name).collect();
            assert_eq!(of.iter().map(|s| s.count).sum::<u64>(), 100_000, "{name}: every span counted");
            assert_eq!(of.iter().map(|s| s.start_ns).min(), Some(if name == "forward" { 0 } else { 500 }));
            assert_eq!(of.iter().map(|s| s.end_ns).max(), Some(99_999 * 1000 + if name == "forward" { 400 } else { 900 }));
        }
        assert_eq!(spans.iter().filter(|s| s.mark).map(|s| (s.start_ns, s.end_ns, s.count)).collect::<Vec<_>>(), [(0, 100_000_000, 1)]);
        assert!(spans.windows(2).all(|w| w[0].start_ns <= w[1].start_ns), "in time order");
    }

    #[test]
    fn under_the_cap_nothing_is_merged() {
        let mut p = Phases::new(true);
        for i in 0..1000u64 {
            range(&mut p, "step", 2, i * 10, i * 10 + 5);
        }
        let (spans, quantum) = p.finish(10_000);
        assert_eq!((spans.len(), quantum), (1000, 0));
        assert!(spans.iter().all(|s| s.count == 1));
    }
}
