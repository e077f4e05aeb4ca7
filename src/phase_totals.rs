//! Aggregate mode's phases: which phase each call is in, decided as a reader decides it from a
//! full trace's Phase records (the innermost range open on the calling thread, else the
//! process's latest mark; tools/src/read/phases.rs), and per group and phase the allocations,
//! failures and the group's peak among the phase's allocations. Distinct names are bounded
//! (`MAX_NAMES`; later ones count as one), so a run that names every step stays O(sites).
//! Depends on nothing in the crate.

use gpumemtrace_format::{AggPhase, MemKind, PhaseOp, Record};
use rustc_hash::FxHashMap;

/// Phase names kept apart at most; later new names share `OTHERS`.
const MAX_NAMES: usize = 4096;
const OTHERS: &str = "(other phases: more than 4096 names)";
/// Calls made in no phase.
const NONE: u32 = u32::MAX;

#[derive(Default)]
struct Totals {
    allocations: u64,
    allocated_bytes: u64,
    failed: u64,
    peak_bytes: u64,
}

#[derive(Default)]
pub struct PhaseTotals {
    names: Vec<String>,
    index: FxHashMap<String, u32>,
    /// Open ranges per thread (name ids), innermost last; the process's latest mark.
    threads: FxHashMap<u32, Vec<u32>>,
    mark: Option<u32>,
    totals: FxHashMap<((i32, MemKind), u32), Totals>,
}

impl PhaseTotals {
    pub fn phase(&mut self, tid: u32, op: PhaseOp, name: &str) {
        match op {
            PhaseOp::Push => {
                let id = self.intern(name);
                self.threads.entry(tid).or_default().push(id);
            }
            // A pop without a push (the range opened before tracing) closes nothing.
            PhaseOp::Pop => {
                self.threads.entry(tid).or_default().pop();
            }
            PhaseOp::Mark => self.mark = Some(self.intern(name)),
        }
    }

    /// An allocation of `bytes` on `tid` in `group`, whose live bytes are `group_live` after it.
    pub fn alloc(&mut self, tid: u32, group: (i32, MemKind), bytes: u64, group_live: u64) {
        let t = self.totals.entry((group, self.current(tid))).or_default();
        t.allocations += 1;
        t.allocated_bytes += bytes;
        t.peak_bytes = t.peak_bytes.max(group_live);
    }

    /// A failed allocation call on `tid` (`group`: the calling device and the function's kind).
    pub fn failed(&mut self, tid: u32, group: (i32, MemKind)) {
        self.totals.entry((group, self.current(tid))).or_default().failed += 1;
    }

    /// One AggPhase record per group and phase, for summary `seq`.
    pub fn records(&self, seq: u64) -> Vec<Record> {
        let mut v: Vec<AggPhase> = self
            .totals
            .iter()
            .map(|(&((device, kind), id), t)| AggPhase {
                seq,
                device,
                kind,
                name: if id == NONE { String::new() } else { self.names[id as usize].clone() },
                allocations: t.allocations,
                allocated_bytes: t.allocated_bytes,
                failed: t.failed,
                peak_bytes: t.peak_bytes,
            })
            .collect();
        v.sort_by(|a, b| (a.device, a.kind, &a.name).cmp(&(b.device, b.kind, &b.name)));
        v.into_iter().map(Record::AggPhase).collect()
    }

    fn current(&self, tid: u32) -> u32 {
        match self.threads.get(&tid).and_then(|s| s.last()) {
            Some(&id) => id,
            None => self.mark.unwrap_or(NONE),
        }
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let name = if self.names.len() >= MAX_NAMES { OTHERS } else { name };
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.names.push(name.to_owned());
        let i = self.names.len() as u32 - 1;
        self.index.insert(name.to_owned(), i);
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: (i32, MemKind) = (0, MemKind::Device);

    fn rows(p: &PhaseTotals) -> Vec<(String, u64, u64, u64, u64)> {
        p.records(0)
            .into_iter()
            .map(|r| match r {
                Record::AggPhase(a) => (a.name, a.allocations, a.allocated_bytes, a.failed, a.peak_bytes),
                r => panic!("{r:?}"),
            })
            .collect()
    }

    #[test]
    fn a_call_is_in_its_threads_innermost_range_else_in_the_processs_mark() {
        let mut p = PhaseTotals::default();
        p.alloc(1, G, 10, 10); // no phase yet
        p.phase(1, PhaseOp::Mark, "epoch 1");
        p.alloc(2, G, 20, 30); // thread 2 has no range: the mark
        p.phase(1, PhaseOp::Push, "forward");
        p.phase(1, PhaseOp::Push, "attention");
        p.alloc(1, G, 5, 35);
        p.phase(1, PhaseOp::Pop, "");
        p.alloc(1, G, 7, 42);
        p.failed(1, G);
        p.phase(1, PhaseOp::Pop, "");
        p.alloc(1, G, 1, 25); // the mark again: its peak stays 30
        assert_eq!(
            rows(&p),
            [
                ("".into(), 1, 10, 0, 10),
                ("attention".into(), 1, 5, 0, 35),
                ("epoch 1".into(), 2, 21, 0, 30),
                ("forward".into(), 1, 7, 1, 42)
            ]
        );
    }

    #[test]
    fn names_past_the_bound_share_one_entry() {
        let mut p = PhaseTotals::default();
        for i in 0..MAX_NAMES + 10 {
            p.phase(1, PhaseOp::Mark, &format!("step {i}"));
            p.alloc(1, G, 1, 1);
        }
        let r = rows(&p);
        assert_eq!(r.len(), MAX_NAMES + 1);
        assert!(r.contains(&(OTHERS.into(), 10, 10, 0, 1)));
    }
}
