//! Aggregate mode (`GPUMEMTRACE_AGGREGATE=1`, memray's `--aggregate` is the model): the writer
//! keeps totals per allocation site, the live set and each group's peak, and writes summaries
//! of them (docs/format.md, "Aggregate mode") instead of one record per event, so the trace
//! grows with the sites, not with the run. Memory: O(sites + live allocations); O(1) per event.
//!
//! What was live by site at a group's peak is kept lazily, as the CLI's `model/snapshots.rs`
//! does: a peak bumps its group's mark; a site's first change after a newer mark first saves its
//! tally (its value at the mark). Depends on nothing in the crate.

use gpumemtrace_format::{AggPeak, AggSite, AggStart, MemKind, Op, PhaseOp, Record};
use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

use crate::phase_totals::PhaseTotals;

/// Device and memory kind, as the reader groups its statistics.
type Group = (i32, MemKind);

#[derive(Default)]
struct Site {
    tid: u32,
    allocations: u64,
    allocated_bytes: u64,
    frees: u64,
    live: (u64, u64),
    /// The group's mark this site saw last, and its live (bytes, count) then.
    seen: u64,
    at_peak: (u64, u64),
    /// The same for the Python program's end.
    seen_exit: u64,
    at_exit: (u64, u64),
}

#[derive(Default)]
struct Peak {
    live: u64,
    peak: u64,
    peak_time_ns: u64,
    mark: u64,
}

#[derive(Clone, Copy)]
struct LiveAlloc {
    site: usize,
    size: u64,
    time_ns: u64,
}

/// One successful call, as the writer has it (stacks already interned).
pub struct Call {
    pub api: u32,
    pub tid: u32,
    pub time_ns: u64,
    pub device: i32,
    pub addr: u64,
    pub size: u64,
    pub extra: u64,
    pub stack: u32,
    pub pystack: u32,
}

/// The first summary after the start is written after this long; each wait doubles, up to
/// `MAX_INTERVAL`: a crash leaves a summary at most that old, and a day-long run writes a few
/// hundred summaries, not one every few seconds.
const FIRST_INTERVAL: Duration = Duration::from_secs(2);
const MAX_INTERVAL: Duration = Duration::from_secs(300);

pub struct Aggregate {
    /// Memory kind and operation by Api id.
    apis: FxHashMap<u32, (MemKind, Op)>,
    next_summary: Instant,
    interval: Duration,
    /// Sites by (group, stack, Python stack), and their keys in order of first use.
    site_ids: FxHashMap<(Group, u32, u32), usize>,
    sites: Vec<((Group, u32, u32), Site)>,
    /// Live allocations by (address namespace, address). One displaced by a new allocation at
    /// its address stays live, as the reader keeps it (`read/live.rs`), oldest first: the
    /// trace missed its free, or its free comes later in call order than the new allocation
    /// (another thread got the address first) and frees it by being older than the new one.
    live: FxHashMap<(u8, u64), LiveAlloc>,
    displaced: FxHashMap<(u8, u64), Vec<LiveAlloc>>,
    groups: FxHashMap<Group, Peak>,
    /// GPU memory per device (the kinds that occupy it, see `MemKind::occupies_gpu`).
    devices: FxHashMap<i32, Peak>,
    /// The next summary's number (0 is the empty one written at the start).
    seq: u64,
    /// The Python program's end, found as the reader finds it in a full trace (`model/load.rs`):
    /// the first event of the main thread (`pid`) without Python code after one with it; a
    /// later one with Python code cancels it. `exit_mark` counts the candidates.
    pid: u32,
    python_seen: bool,
    python_exit_ns: Option<u64>,
    exit_mark: u64,
    seen_events: u64,
    phases: PhaseTotals,
}

impl Aggregate {
    /// `apis`: (id, kind, operation) of each hooked function that records events.
    pub fn new(pid: u32, apis: impl Iterator<Item = (u32, MemKind, Op)>) -> Aggregate {
        Aggregate {
            pid,
            python_seen: false,
            python_exit_ns: None,
            exit_mark: 0,
            seen_events: 0,
            phases: PhaseTotals::default(),
            apis: apis.map(|(id, k, o)| (id, (k, o))).collect(),
            next_summary: Instant::now() + FIRST_INTERVAL,
            interval: FIRST_INTERVAL,
            site_ids: FxHashMap::default(),
            sites: Vec::new(),
            live: FxHashMap::default(),
            displaced: FxHashMap::default(),
            groups: FxHashMap::default(),
            devices: FxHashMap::default(),
            seq: 0,
        }
    }

    /// Whether a periodic summary is due (then the next one is due twice as late).
    pub fn due(&mut self) -> bool {
        let now = Instant::now();
        if now < self.next_summary {
            return false;
        }
        self.interval = (self.interval * 2).min(MAX_INTERVAL);
        self.next_summary = now + self.interval;
        true
    }

    /// A phase boundary (docs/format.md "Phases").
    pub fn phase(&mut self, tid: u32, op: PhaseOp, name: &str) {
        self.phases.phase(tid, op, name);
    }

    /// A failed call (written as an event): counted in its phase when it allocates. For a
    /// failed allocation, returns the GPU memory live on its device now, which a reader of the
    /// summary cannot replay (a failed free is no out-of-memory: `None`).
    pub fn failed(&mut self, api: u32, tid: u32, device: i32) -> Option<u64> {
        let &(kind, Op::Alloc) = self.apis.get(&api)? else { return None };
        self.phases.failed(tid, (device, kind));
        Some(self.devices.get(&device).map_or(0, |d| d.live))
    }

    /// Whether Api `id` allocates.
    pub fn is_alloc(&self, id: u32) -> bool {
        self.apis.get(&id).is_some_and(|&(_, op)| op == Op::Alloc)
    }

    /// Every event, before it is absorbed or written: `python` when its thread ran Python code.
    pub fn seen(&mut self, tid: u32, python: bool, time_ns: u64) {
        if tid == self.pid {
            if python {
                self.python_seen = true;
                self.python_exit_ns = None;
            } else if self.python_seen && self.python_exit_ns.is_none() && self.seen_events > 0 {
                self.python_exit_ns = Some(time_ns);
                self.exit_mark += 1;
            }
        }
        self.seen_events += 1;
    }

    /// Takes a successful call into the summary; false when it has to be written as an event
    /// (a free of nothing live: the reader reports it as a bad free; an unknown function).
    pub fn absorb(&mut self, c: &Call) -> bool {
        let Some(&(kind, op)) = self.apis.get(&c.api) else { return false };
        let ns = kind.namespace();
        match op {
            // Nothing allocated or freed at NULL (the reader ignores these too).
            _ if c.addr == 0 => true,
            Op::Alloc => {
                // A mapping belongs to the device of the physical memory it maps.
                let device = match kind {
                    MemKind::VmmMapped => self
                        .live
                        .get(&(MemKind::VmmPhysical.namespace(), c.extra))
                        .map_or(c.device, |l| self.sites[l.site].0 .0 .0),
                    _ => c.device,
                };
                let group = (device, kind);
                let next = self.sites.len();
                let site = *self.site_ids.entry((group, c.stack, c.pystack)).or_insert(next);
                if site == next {
                    self.sites.push(((group, c.stack, c.pystack), Site { tid: c.tid, ..Site::default() }));
                }
                let g = self.groups.entry(group).or_default();
                let s = &mut self.sites[site].1;
                change(s, (g.mark, self.exit_mark), c.size, true);
                s.allocations += 1;
                s.allocated_bytes += c.size;
                rise(g, c.size, c.time_ns);
                self.phases.alloc(c.tid, group, c.size, g.live);
                if kind.occupies_gpu() {
                    rise(self.devices.entry(c.device).or_default(), c.size, c.time_ns);
                }
                if let Some(old) = self.live.insert((ns, c.addr), LiveAlloc { site, size: c.size, time_ns: c.time_ns }) {
                    self.displaced.entry((ns, c.addr)).or_default().push(old);
                }
                true
            }
            Op::Free => {
                let Some(old) = self.take_freed((ns, c.addr), c.time_ns) else { return false };
                let (key, s) = &mut self.sites[old.site];
                let g = self.groups.entry(key.0).or_default();
                change(s, (g.mark, self.exit_mark), old.size, false);
                s.frees += 1;
                g.live -= old.size;
                if key.0 .1.occupies_gpu() {
                    if let Some(d) = self.devices.get_mut(&key.0 .0) {
                        d.live = d.live.saturating_sub(old.size);
                    }
                }
                true
            }
        }
    }

    /// The allocation a free at `at` frees: the live one, or, for a free older than it, the
    /// newest one it displaced (as the reader's `LiveSet::take_freed` decides).
    fn take_freed(&mut self, at: (u8, u64), time_ns: u64) -> Option<LiveAlloc> {
        if let Some(d) = self.displaced.get_mut(&at) {
            if self.live.get(&at).is_none_or(|l| time_ns < l.time_ns) {
                let old = d.pop();
                if d.is_empty() {
                    self.displaced.remove(&at);
                }
                return old;
            }
        }
        self.live.remove(&at)
    }

    /// The records of a summary of the run so far: `AggStart`, a site record per site, a peak
    /// record per group and device, `AggEnd`.
    pub fn summary(&mut self, time_ns: u64, events: u64, final_: bool) -> Vec<Record> {
        let seq = self.seq;
        self.seq += 1;
        let mut out = Vec::with_capacity(self.sites.len() + self.groups.len() + self.devices.len() + 2);
        let python_exit_ns = self.python_exit_ns;
        out.push(Record::AggStart(AggStart { seq, time_ns, events, final_, python_exit_ns }));
        for ((group, stack, pystack), s) in &self.sites {
            let mark = self.groups.get(group).map_or(0, |g| g.mark);
            let at_peak = if s.seen == mark { s.at_peak } else { s.live };
            let at_exit = match python_exit_ns {
                None => (0, 0),
                Some(_) if s.seen_exit == self.exit_mark => s.at_exit,
                Some(_) => s.live,
            };
            out.push(Record::AggSite(AggSite {
                seq,
                device: group.0,
                kind: group.1,
                stack: *stack,
                pystack: *pystack,
                allocations: s.allocations,
                allocated_bytes: s.allocated_bytes,
                frees: s.frees,
                live_bytes: s.live.0,
                live_count: s.live.1,
                peak_bytes: at_peak.0,
                peak_count: at_peak.1,
                exit_bytes: at_exit.0,
                exit_count: at_exit.1,
                tid: s.tid,
            }));
        }
        let mut peaks: Vec<AggPeak> = self
            .groups
            .iter()
            .map(|(&(device, kind), g)| AggPeak { seq, device, kind: Some(kind), bytes: g.peak, time_ns: g.peak_time_ns })
            .chain(self.devices.iter().map(|(&device, d)| AggPeak { seq, device, kind: None, bytes: d.peak, time_ns: d.peak_time_ns }))
            .collect();
        peaks.sort_by_key(|p| (p.device, p.kind));
        out.extend(peaks.into_iter().map(Record::AggPeak));
        out.extend(self.phases.records(seq));
        out.push(Record::AggEnd(seq));
        out
    }

    /// Live allocations (displaced ones included).
    #[cfg(test)]
    fn live_count(&self) -> usize {
        self.live.len() + self.displaced.values().map(Vec::len).sum::<usize>()
    }
}

/// A site's tally rises or falls by one allocation of `bytes`; first saved as it was at its
/// group's latest peak, and at the Python program's latest end, if this is its first change
/// since.
fn change(s: &mut Site, (mark, exit_mark): (u64, u64), bytes: u64, alloc: bool) {
    if s.seen < mark {
        s.seen = mark;
        s.at_peak = s.live;
    }
    if s.seen_exit < exit_mark {
        s.seen_exit = exit_mark;
        s.at_exit = s.live;
    }
    if alloc {
        s.live = (s.live.0 + bytes, s.live.1 + 1);
    } else {
        s.live = (s.live.0.saturating_sub(bytes), s.live.1.saturating_sub(1));
    }
}

/// Live bytes rise; a new peak bumps the mark (after the change: the peak includes it).
fn rise(p: &mut Peak, bytes: u64, time_ns: u64) {
    p.live += bytes;
    if p.live > p.peak {
        p.peak = p.live;
        p.peak_time_ns = time_ns;
        p.mark += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: Op, addr: u64, size: u64, stack: u32, t: u64) -> Call {
        Call { api: op as u32, tid: 1, time_ns: t, device: 0, addr, size, extra: 0, stack, pystack: 0 }
    }

    fn aggregate() -> Aggregate {
        Aggregate::new(7, [(1, MemKind::Device, Op::Alloc), (2, MemKind::Device, Op::Free)].into_iter())
    }

    fn sites(recs: &[Record]) -> Vec<(u32, u64, u64, u64, u64, u64)> {
        recs.iter()
            .filter_map(|r| match r {
                Record::AggSite(s) => Some((s.stack, s.allocations, s.frees, s.live_bytes, s.peak_bytes, s.peak_count)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_summary_holds_totals_the_live_set_and_what_was_live_at_the_peak() {
        let mut a = aggregate();
        assert!(a.absorb(&call(Op::Alloc, 0x1000, 100, 1, 10)));
        assert!(a.absorb(&call(Op::Alloc, 0x2000, 50, 2, 20))); // peak 150
        assert!(a.absorb(&call(Op::Free, 0x2000, 0, 0, 30)));
        assert!(a.absorb(&call(Op::Alloc, 0x3000, 30, 3, 40))); // 130: below the peak
        assert!(!a.absorb(&call(Op::Free, 0x9000, 0, 0, 50)), "a free of nothing live is written as it is");
        let recs = a.summary(60, 5, true);
        assert_eq!(recs.first(), Some(&Record::AggStart(AggStart { seq: 0, time_ns: 60, events: 5, final_: true, python_exit_ns: None })));
        assert_eq!(recs.last(), Some(&Record::AggEnd(0)));
        assert_eq!(sites(&recs), [(1, 1, 0, 100, 100, 1), (2, 1, 1, 0, 50, 1), (3, 1, 0, 30, 0, 0)]);
        let peaks: Vec<_> = recs.iter().filter_map(|r| if let Record::AggPeak(p) = r { Some((p.kind, p.bytes, p.time_ns)) } else { None }).collect();
        assert_eq!(peaks, [(None, 150, 20), (Some(MemKind::Device), 150, 20)]);
        assert_eq!(a.live_count(), 2);
        // A later, higher peak replaces the first.
        assert!(a.absorb(&call(Op::Alloc, 0x4000, 500, 3, 70)));
        assert_eq!(sites(&a.summary(80, 6, true)), [(1, 1, 0, 100, 100, 1), (2, 1, 1, 0, 0, 0), (3, 2, 0, 530, 530, 2)]);
    }

    #[test]
    fn a_failed_allocation_says_what_was_live_on_its_device_and_a_failed_free_says_nothing() {
        let mut a = aggregate();
        assert!(a.absorb(&call(Op::Alloc, 0x1000, 100, 1, 10)));
        assert!(a.absorb(&call(Op::Alloc, 0x2000, 50, 2, 20)));
        assert_eq!(a.failed(Op::Alloc as u32, 1, 0), Some(150));
        assert_eq!(a.failed(Op::Alloc as u32, 1, 3), Some(0), "nothing live on that device");
        assert_eq!(a.failed(Op::Free as u32, 1, 0), None, "a failed free is no out-of-memory");
    }

    #[test]
    fn a_free_older_than_the_allocation_now_at_its_address_frees_the_one_it_displaced() {
        // Thread A frees 0x1000 and thread B gets it at once, but B's allocation comes first in
        // call order: A's free, older than B's allocation, frees A's; B's free then frees B's.
        let mut a = aggregate();
        a.absorb(&call(Op::Alloc, 0x1000, 100, 1, 10)); // A
        a.absorb(&call(Op::Alloc, 0x1000, 300, 2, 30)); // B, at 30
        assert!(a.absorb(&call(Op::Free, 0x1000, 0, 0, 20)), "A's free, at 20");
        assert_eq!(sites(&a.summary(40, 3, false)), [(1, 1, 1, 0, 100, 1), (2, 1, 0, 300, 300, 1)]);
        assert!(a.absorb(&call(Op::Free, 0x1000, 0, 0, 50)), "B's free");
        assert_eq!(a.live_count(), 0);
    }

    #[test]
    fn an_allocation_at_a_live_address_leaves_the_old_one_live() {
        let mut a = aggregate();
        a.absorb(&call(Op::Alloc, 0x1000, 100, 1, 10));
        a.absorb(&call(Op::Alloc, 0x1000, 100, 1, 20));
        a.absorb(&call(Op::Free, 0x1000, 0, 0, 30));
        assert_eq!(sites(&a.summary(40, 3, false)), [(1, 2, 1, 100, 200, 2)]);
        assert_eq!(a.live_count(), 1);
    }

    #[test]
    fn the_python_programs_end_keeps_what_was_live_then() {
        let mut a = aggregate();
        let at = |a: &mut Aggregate, tid: u32, python: bool, c: Call| {
            a.seen(tid, python, c.time_ns);
            assert!(a.absorb(&c));
        };
        at(&mut a, 7, true, call(Op::Alloc, 0x1000, 100, 1, 10));
        at(&mut a, 8, false, call(Op::Alloc, 0x2000, 50, 2, 20)); // another thread: no end
        at(&mut a, 7, false, call(Op::Free, 0x1000, 0, 0, 30)); // the end: before this free
        at(&mut a, 7, false, call(Op::Free, 0x2000, 0, 0, 40));
        let recs = a.summary(50, 4, true);
        assert!(matches!(recs[0], Record::AggStart(AggStart { python_exit_ns: Some(30), .. })), "{:?}", recs[0]);
        let exit: Vec<_> = recs.iter().filter_map(|r| if let Record::AggSite(s) = r { Some((s.stack, s.live_bytes, s.exit_bytes, s.exit_count)) } else { None }).collect();
        assert_eq!(exit, [(1, 0, 100, 1), (2, 0, 50, 1)]);
        // Python code on the main thread again: that was not the end.
        a.seen(7, true, 60);
        assert!(matches!(a.summary(70, 5, true)[0], Record::AggStart(AggStart { python_exit_ns: None, .. })));
    }
}
