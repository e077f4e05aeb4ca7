//! Loading a trace into the model.
//!
//! Loading streams the file twice rather than keeping its events: memory stays proportional
//! to the live set (plus the interned stacks), however long the trace. Pass 1 replays
//! everything with the model's observers and notes at which event each group peaks; pass 2
//! replays up to the last of those events and snapshots the live set of each group at its peak.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read};
use std::ops::ControlFlow;
use std::path::Path;

use gpumemtrace_format::{MemKind, Op, Record};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::autograd::Backward;
use super::groups::Groups;
use super::pool::Pools;
use super::timeseries::TimeSeries;
use super::trace::Trace;
use crate::read::filter::Filter;
use crate::read::input::{display, Input};
use crate::read::live::{tally, GroupKey, LiveSet, StackUse};
use crate::read::records::{for_each_record, Outcome};
use crate::read::replay::{All, Observer, Replay};

impl Trace {
    /// Loads a trace from a source that can be opened twice (one per pass). (Reports load
    /// files through [`load`], which adds a progress bar.)
    #[cfg(test)]
    pub fn load_from<R: Read>(open: impl Fn() -> io::Result<R>) -> Result<Trace, String> {
        Trace::load_with(open, &Filter::default(), &mut ())
    }

    /// Loads a trace counting only the events `filter` admits, and shows every admitted
    /// event to `observe` (pass 1 only), in trace order, after the model's own observers.
    #[cfg(test)]
    pub fn load_with<R: Read>(
        open: impl Fn() -> io::Result<R>,
        filter: &Filter,
        observe: &mut dyn Observer,
    ) -> Result<Trace, String> {
        Trace::load_recovering(open, &|| None, filter, observe)
    }

    /// [`Trace::load_with`], each pass completed by what `recovery` gives (the journal of a
    /// process that did not finish its trace).
    pub fn load_recovering<R: Read>(
        open: impl Fn() -> io::Result<R>,
        recovery: &dyn Fn() -> Option<gpumemtrace_format::recover::Recovery>,
        filter: &Filter,
        observe: &mut dyn Observer,
    ) -> Result<Trace, String> {
        let mut trace = Trace::default();

        // Pass 1: everything but the peak snapshots.
        let (mut python_main_seen, mut python_exit): (bool, Option<(u64, u64)>) = (false, None);
        let mut replay = Replay::new(filter, true);
        let mut groups = Groups { pools: Pools::lazy(), ..Groups::default() };
        let mut series = TimeSeries::default();
        let mut backward = Backward::default();
        trace.outcome = for_each_record(open().map_err(|e| e.to_string())?, recovery(), |rec| {
            match rec {
                Record::Process(p) => trace.process = Some(p),
                Record::Api(a) => {
                    replay.api(a.clone());
                    trace.apis.insert(a.id, a);
                }
                Record::Module(m) => trace.modules.push(m),
                Record::Stack(s) => {
                    trace.stacks.insert(s.id, s.frames);
                }
                Record::Event(mut e) => {
                    trace.events += 1;
                    let own_python = e.pystack != 0 || e.flags & gpumemtrace_format::event_flags::PYTHON != 0;
                    let is_alloc = replay.api_of(e.api).is_some_and(|a| a.op == Op::Alloc);
                    e.pystack = backward.attribute(&e, is_alloc, &trace.py_codes, &trace.py_stacks);
                    e.stack = trace.stack_key(&e);
                    trace.stack_tid.entry(e.stack).or_insert(e.tid);
                    seed_at_first_block(&mut groups.pools, &replay, &e);
                    if !replay.apply(&e, &mut All(&mut [&mut groups, &mut series, observe])) {
                        trace.unknown_api_events += 1;
                    }
                    if trace.process.as_ref().is_some_and(|p| p.pid == e.tid) {
                        if own_python {
                            python_main_seen = true;
                            python_exit = None;
                        } else if python_main_seen && python_exit.is_none() {
                            python_exit = Some((replay.ordinal().saturating_sub(1), e.time_ns));
                        }
                    }
                }
                Record::Notice(n) => trace.notices.push(n),
                Record::Stats(s) => trace.stats = Some(s),
                Record::PyCode(c) => {
                    trace.py_codes.insert(c.id, c);
                }
                Record::PyStack(s) => {
                    trace.py_stacks.insert(s.id, s.frames);
                }
                Record::Thread(t) => {
                    trace.threads.insert(t.tid, t);
                }
                Record::Phase(p) => replay.phase(&p),
                Record::Unknown(_) => {}
            }
            ControlFlow::Continue(())
        })?;

        // What pass 1's live set says at the end, taken before pass 2 makes a live set of its
        // own: two at once would double the reader's memory.
        let displaced: Vec<GroupKey> = replay.live().displaced().map(|l| l.key).collect();
        let leak_stacks: Vec<(GroupKey, Vec<StackUse>)> =
            replay.groups().keys().map(|k| (*k, replay.live().by_stack(*k))).collect();
        let direct_at_end = direct_by_stack(replay.live(), &groups.pools);
        replay.forget_live();
        groups.pools.forget_ranges();

        // Pass 2: replay again up to the last peak, snapshotting each group at its own.
        let mut snapshot_at: BTreeMap<u64, Vec<GroupKey>> = BTreeMap::new();
        for (key, g) in &groups.groups {
            if let Some(n) = g.peak_event {
                snapshot_at.entry(n).or_default().push(*key);
            }
        }
        // And the live set on the device of the last allocation that ran out of memory, as it
        // failed (other errors, a capability probe, say nothing about what was live).
        let failure_at = groups
            .failures
            .iter()
            .rev()
            .find(|f| f.class() == crate::units::Failed::OutOfMemory)
            .map(|f| (f.ordinal, f.device));
        let failure_keys: Vec<GroupKey> = match failure_at {
            Some((_, device)) => {
                let mut keys: Vec<GroupKey> = groups
                    .groups
                    .keys()
                    .filter(|k| k.device == device && (k.kind.occupies_gpu() || k.kind == MemKind::Block))
                    .copied()
                    .collect();
                // Blocks first: the program's tensors, then the memory they lie in.
                keys.sort_by_key(|k| k.kind != MemKind::Block);
                keys
            }
            None => Vec::new(),
        };
        let python_exit = python_exit.filter(|&(n, _)| n > 0);
        trace.python_exit_ns = python_exit.map(|(_, t)| t);
        let mut at_python_exit: Vec<(GroupKey, u64, u64, Vec<StackUse>)> = Vec::new();
        let mut direct_at_python_exit: BTreeMap<i32, Vec<StackUse>> = BTreeMap::new();
        let last_snapshot =
            snapshot_at.keys().next_back().copied().max(failure_at.map(|f| f.0)).max(python_exit.map(|p| p.0));
        if let Some(last) = last_snapshot {
            let mut again = Replay::new(filter, false);
            let mut pools = Pools::lazy();
            let mut backward = Backward::default();
            // Errors were reported by pass 1, and pass 2 stops before reaching them.
            let _ = for_each_record(open().map_err(|e| e.to_string())?, recovery(), |rec| {
                match rec {
                    // Api records are tracked as they come so both passes replay the same events.
                    Record::Api(a) => again.api(a),
                    Record::Phase(p) => again.phase(&p),
                    Record::Event(mut e) => {
                        let is_alloc = again.api_of(e.api).is_some_and(|a| a.op == Op::Alloc);
                        e.pystack = backward.attribute(&e, is_alloc, &trace.py_codes, &trace.py_stacks);
                        if e.pystack != 0 {
                            // Every pair was seen by pass 1.
                            e.stack = trace.combined_ids.get(&(e.stack, e.pystack)).copied().unwrap_or(e.stack);
                        }
                        seed_at_first_block(&mut pools, &again, &e);
                        if again.apply(&e, &mut pools) {
                            let n = again.ordinal();
                            for key in snapshot_at.get(&n).into_iter().flatten() {
                                groups.group(*key).peak_stacks = again.live().by_stack(*key);
                            }
                            if python_exit.is_some_and(|(p, _)| p == n) {
                                at_python_exit = again
                                    .groups()
                                    .iter()
                                    .map(|(k, &(bytes, count))| (*k, bytes, count, again.live().by_stack(*k)))
                                    .collect();
                                trace.pools_at_python_exit = pools.by_device.clone();
                                direct_at_python_exit = direct_by_stack(again.live(), &pools);
                            }
                            if failure_at.is_some_and(|(f, _)| f == n) {
                                trace.last_failure_live = failure_keys
                                    .iter()
                                    .map(|&k| (k, again.live().by_stack(k)))
                                    .filter(|(_, v)| !v.is_empty())
                                    .collect();
                            }
                            if n >= last {
                                return ControlFlow::Break(());
                            }
                        }
                    }
                    _ => {}
                }
                ControlFlow::Continue(())
            });
        }

        // Allocations displaced at their address and never freed: the trace missed a free.
        for key in displaced {
            groups.group(key).double_allocs += 1;
        }
        for (key, &(bytes, count)) in replay.groups() {
            let g = groups.group(*key);
            (g.live_bytes, g.live_count) = (bytes, count);
        }
        for (key, stacks) in leak_stacks {
            groups.group(key).leak_stacks = stacks;
        }
        for (device, &live) in replay.devices() {
            groups.devices.entry(*device).or_default().live_bytes = live;
        }
        if python_exit.is_some() {
            for g in groups.groups.values_mut() {
                g.live_at_python_exit = Some((0, 0));
                g.leak_stacks = Vec::new();
            }
            for (key, bytes, count, stacks) in at_python_exit {
                let g = groups.group(key);
                g.live_at_python_exit = Some((bytes, count));
                g.leak_stacks = stacks;
            }
        }
        trace.direct_leak_stacks =
            if python_exit.is_some() { direct_at_python_exit } else { direct_at_end };
        let growth_end = trace.python_exit_ns.unwrap_or(replay.last_ns());
        trace.growth = std::mem::take(&mut groups.growth).finish(growth_end);
        trace.pools = std::mem::take(&mut groups.pools.by_device);
        trace.groups = groups.groups;
        trace.devices = groups.devices;
        trace.failures = groups.failures;
        trace.bad_frees = groups.bad_frees;
        trace.bad_frees_omitted = groups.bad_frees_omitted;
        (trace.series, trace.allocated, trace.by_phase) = series.finish(replay.phases().names());
        trace.end_ns = replay.end_ns();
        (trace.spans, trace.spans_omitted) = replay.phases_mut().finish(trace.end_ns);
        trace.phase_names = replay.phases().names().to_vec();
        trace.alloc_devices = replay.admission().alloc_devices();
        trace.filtered_out = replay.admission().filtered_out;
        Ok(trace)
    }
}

/// At the first block, lazy pools (`Pools::lazy`) learn the driver ranges live then.
fn seed_at_first_block(pools: &mut Pools, replay: &Replay, e: &gpumemtrace_format::Event) {
    if pools.waiting() && replay.api_of(e.api).is_some_and(|a| a.kind == MemKind::Block && a.op == Op::Alloc) {
        let ranges = replay.live().at_addresses().filter(|(_, l)| matches!(l.key.kind, MemKind::Device | MemKind::VmmMapped));
        pools.seed(ranges.map(|((_, addr), l)| (addr, l.size, l.key.device)));
    }
}

/// Per device with blocks: its live device memory that is not a pool segment, by stack.
fn direct_by_stack(live: &LiveSet, pools: &Pools) -> BTreeMap<i32, Vec<StackUse>> {
    let mut out = BTreeMap::new();
    for &device in pools.by_device.keys() {
        let key = GroupKey { device, kind: MemKind::Device };
        let direct = live
            .at_addresses()
            .filter(|((ns, addr), l)| *ns == 0 && l.key == key && !pools.is_segment(*addr))
            .map(|(_, l)| l);
        let v = tally(direct);
        if !v.is_empty() {
            out.insert(device, v);
        }
    }
    out
}

/// Loads `path` (`-`: standard input) with a progress bar on stderr (drawn only when stderr is
/// a terminal and the trace is large enough to wait for).
pub fn load(path: &Path, filter: &Filter, observe: &mut dyn Observer) -> Result<Trace, String> {
    load_input(&Input::open(path)?, filter, observe)
}

/// [`load`] from an opened input: a file is read once per pass, a stream was read once into
/// memory. A trace with nothing readable (an empty file, one that ends inside the header) is an
/// error: there is nothing to report on, and "no allocations" would say something untrue.
pub fn load_input(input: &Input, filter: &Filter, observe: &mut dyn Observer) -> Result<Trace, String> {
    let len = input.len();
    let bar = if len >= 32 << 20 {
        let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let p = display(input.path());
    let name = match input.path().file_name() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => p.clone(),
    };
    let pass = std::cell::Cell::new(0);
    let r = Trace::load_recovering(
        || {
            pass.set(pass.get() + 1);
            bar.set_position(0);
            bar.set_message(match pass.get() {
                1 => format!("reading {name}"),
                _ => format!("peaks of {name}"),
            });
            input.reader().map(|r| BufReader::with_capacity(1 << 20, bar.wrap_read(r)))
        },
        &|| input.recovery(),
        filter,
        observe,
    )
    .map_err(|e| format!("{p}: {e}"));
    bar.finish_and_clear();
    match r {
        Ok(t) if t.outcome == Outcome::Truncated { offset: 0 } => Err(unreadable(&p, len)),
        r => r,
    }
}

/// Why a trace that stops before its first record cannot be read.
fn unreadable(path: &str, len: u64) -> String {
    if len == 0 {
        format!("{path}: the file is empty, not a trace (the traced process may have died before the tracer wrote anything)")
    } else {
        format!(
            "{path}: the file ends inside the trace header ({len} of {} bytes), not a readable trace",
            gpumemtrace_format::HEADER_LEN
        )
    }
}

