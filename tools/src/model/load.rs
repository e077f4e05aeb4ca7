//! Loading a trace into the model.
//!
//! Loading streams the file once rather than keeping its events: memory stays proportional to
//! the live set (plus the interned stacks), however long the trace. What was live at moments
//! known only later (each group's peak, the last out-of-memory failure, the Python program's
//! end) is kept by stack as the replay goes (`snapshots`), so one pass is enough.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read};
use std::ops::ControlFlow;
use std::path::Path;

use gpumemtrace_format::{MemKind, Op, Record};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::autograd::Backward;
use super::behind::{behind, threaded, Feed, Observed};
use super::pool::{Pools, Seed};
use super::snapshots::Moment;
use super::trace::Trace;
use crate::error::Error;
use crate::read::filter::Filter;
use crate::read::input::{display, Input};
use crate::read::live::{tally, GroupKey, LiveSet, StackUse};
use crate::read::records::{for_each_record, Outcome};
use crate::read::replay::{Observer, Replay};

impl Trace {
    /// Loads a trace from a source (opened once). (Reports load
    /// files through [`load`], which adds a progress bar.)
    #[cfg(test)]
    pub fn load_from<R: Read + Send>(open: impl Fn() -> io::Result<R>) -> Result<Trace, Error> {
        Trace::load_with(open, &Filter::default(), &mut ())
    }

    /// Loads a trace counting only the events `filter` admits, and shows every admitted
    /// event to `observe`, in trace order, after the model's own observers.
    #[cfg(test)]
    pub fn load_with<R: Read + Send>(
        open: impl Fn() -> io::Result<R>,
        filter: &Filter,
        observe: &mut (dyn Observer + Send),
    ) -> Result<Trace, Error> {
        Trace::load_recovering(open, &|| None, filter, observe)
    }

    /// [`Trace::load_with`], completed by what `recovery` gives (the journal of a
    /// process that did not finish its trace).
    pub fn load_recovering<R: Read + Send>(
        open: impl Fn() -> io::Result<R>,
        recovery: &dyn Fn() -> Option<gpumemtrace_format::recover::Recovery>,
        filter: &Filter,
        observe: &mut (dyn Observer + Send),
    ) -> Result<Trace, Error> {
        let mut trace = Trace::default();
        // An aggregate trace (see `aggregate`) is not completed from its journal: the events it
        // lacks would be replayed on a live set the reader does not have. Its last summary stands.
        let aggregate = super::aggregate::is_aggregate(open().map_err(|e| e.to_string())?);
        if aggregate {
            super::aggregate::check_filter(filter)?;
        }
        let recovery: &dyn Fn() -> Option<gpumemtrace_format::recover::Recovery> = if aggregate { &|| None } else { recovery };
        let mut summaries = super::aggregate::Summaries::default();

        // One pass: the snapshots of moments known only later are kept lazily (`snapshots`).
        let (mut python_main_seen, mut python_exit): (bool, Option<u64>) = (false, None);
        let mut exit_totals: Vec<(GroupKey, (u64, u64))> = Vec::new();
        let mut replay = Replay::new(filter, true);
        let mut backward = Backward::default();
        // Whether the event just read was a failed allocation (an `AggFailure` describes it).
        let mut last_event_failed = false;
        // Whether the pools have learnt the driver ranges (at the first block, see `seed_at_first_block`).
        let mut seeded = false;
        // Phase names handed to the observers so far (see `Feed::phases`).
        let mut phases_sent = 0;
        // The last two stacks seen, whose first threads `stack_tid` already has.
        let mut last_stacks: [Option<u32>; 2] = [None, None];
        let observed = Observed::new(observe);
        let mut damaged = Vec::new();
        let (outcome, observed) = behind(observed, threaded(), |feed| {
            for_each_record(open().map_err(|e| e.to_string())?, recovery(), &mut damaged, |rec| {
                replay.context(&rec);
                match rec {
                    Record::Process(p) => trace.process = Some(p),
                    Record::Api(a) => {
                        feed.api(a.id, &a.name);
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
                        let what = replay.api_of(e.api).map(|a| (a.op, a.kind));
                        let is_alloc = what.is_some_and(|(op, _)| op == Op::Alloc);
                        e.pystack = backward.attribute(&e, is_alloc, &trace.py_codes, &trace.py_stacks);
                        let native = e.stack;
                        e.stack = trace.stack_key(&e);
                        replay.pair(e.stack, native);
                        // Most events repeat one of the last two stacks (allocations' and frees').
                        if !last_stacks.contains(&Some(e.stack)) {
                            last_stacks = [Some(e.stack), last_stacks[0]];
                            trace.stack_tid.entry(e.stack).or_insert(e.tid);
                        }
                        // The Python program ended before the first event of its main thread with
                        // no Python frame (the interpreter's shutdown): what was live just before
                        // it is what the program left. The latest such moment counts.
                        if trace.process.as_ref().is_some_and(|p| p.pid == e.tid) {
                            if own_python {
                                python_main_seen = true;
                                python_exit = None;
                            } else if python_main_seen && python_exit.is_none() && replay.ordinal() > 0 {
                                python_exit = Some(e.time_ns);
                                feed.python_exit();
                                exit_totals = replay.groups().into_iter().collect();
                            }
                        }
                        if !seeded && is_alloc && what.is_some_and(|(_, kind)| kind == MemKind::Block) {
                            seed_at_first_block(feed, &replay);
                            seeded = true;
                        }
                        feed.last_failed = false;
                        if !replay.apply(&e, feed) {
                            trace.unknown_api_events += 1;
                        }
                        last_event_failed = feed.last_failed;
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
                    Record::Phase(p) => {
                        replay.phase(&p);
                        feed.phases(replay.phases().names(), &mut phases_sent);
                    }
                    // Aggregate mode: what was live on the device when the failure just read was
                    // made (the replay has no live set to tell).
                    Record::AggFailure(a) => {
                        if last_event_failed {
                            feed.agg_failure(a.device, a.live_bytes);
                        }
                    }
                    r @ (Record::AggStart(_) | Record::AggSite(_) | Record::AggPeak(_) | Record::AggPhase(_) | Record::AggEnd(_)) => summaries.record(r),
                    Record::Unknown(_) => {}
                }
                ControlFlow::Continue(())
            })
        });
        trace.outcome = outcome?;
        trace.damaged = damaged;
        let Observed { mut groups, series, pools_at_python_exit, .. } = observed;
        groups.settle();
        trace.pools_at_python_exit = pools_at_python_exit;

        for (key, g) in groups.groups.iter_mut() {
            g.peak_stacks = groups.snapshots.at(Moment::Peak, *key);
        }
        // The live set on the device of the last allocation that ran out of memory, as it
        // failed (other errors, a capability probe, say nothing about what was live).
        let failure_device = groups.failures.iter().rev().find(|f| f.class() == crate::units::Failed::OutOfMemory).map(|f| f.device);
        if let Some(device) = failure_device {
            let mut keys: Vec<GroupKey> = groups
                .groups
                .keys()
                .filter(|k| k.device == device && (k.kind.occupies_gpu() || k.kind == MemKind::Block))
                .copied()
                .collect();
            // Blocks first: the program's tensors, then the memory they lie in.
            keys.sort_by_key(|k| k.kind != MemKind::Block);
            trace.last_failure_live = keys
                .into_iter()
                .map(|k| (k, groups.snapshots.at(Moment::Failure, k)))
                .filter(|(_, v)| !v.is_empty())
                .collect();
        }
        trace.python_exit_ns = python_exit;
        let at_python_exit: Vec<(GroupKey, u64, u64, Vec<StackUse>)> = exit_totals
            .into_iter()
            .map(|(k, (bytes, count))| (k, bytes, count, groups.snapshots.at(Moment::PythonExit, k)))
            .collect();
        if python_exit.is_none() {
            trace.pools_at_python_exit = BTreeMap::new();
        }

        // Allocations displaced at their address and never freed: the trace missed a free.
        let displaced: Vec<GroupKey> = replay.live().displaced().map(|l| l.key).collect();
        for key in displaced {
            groups.group(key).double_allocs += 1;
        }
        for (key, (bytes, count)) in replay.groups() {
            let g = groups.group(key);
            (g.live_bytes, g.live_count) = (bytes, count);
            g.leak_stacks = replay.live().by_stack(key);
        }
        for (device, live) in replay.devices() {
            groups.devices.entry(device).or_default().live_bytes = live;
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
        trace.direct_leak_stacks = if python_exit.is_some() {
            let mut direct = groups.snapshots.direct_at_python_exit();
            direct.retain(|device, _| trace.pools_at_python_exit.contains_key(device));
            direct
        } else {
            direct_by_stack(replay.live(), &groups.pools)
        };
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
        (trace.spans, trace.spans_merged_within_ns) = replay.phases_mut().finish(trace.end_ns);
        trace.phase_names = replay.phases().names().to_vec();
        trace.alloc_devices = replay.admission().alloc_devices();
        trace.filtered_out = replay.admission().filtered_out;
        if aggregate {
            summaries.finish(&mut trace, filter.device);
        }
        Ok(trace)
    }
}

/// At the first block, lazy pools (`Pools::lazy`) learn the driver ranges live then.
fn seed_at_first_block(feed: &mut Feed, replay: &Replay) {
    let ranges = replay.live().at_addresses().filter(|(_, l)| matches!(l.key.kind, MemKind::Device | MemKind::VmmMapped));
    feed.seed(
        ranges
            .map(|((_, addr), l)| Seed {
                addr,
                size: l.size,
                device: l.key.device,
                device_alloc: l.key.kind == MemKind::Device,
                stack: l.stack,
            })
            .collect(),
    );
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
pub fn load(path: &Path, filter: &Filter, observe: &mut (dyn Observer + Send)) -> Result<Trace, Error> {
    load_input(&Input::open(path)?, filter, observe)
}

/// [`load`] from an opened input: a file is streamed, a stream was read once into
/// memory. A trace with nothing readable (an empty file, one that ends inside the header) is an
/// error: there is nothing to report on, and "no allocations" would say something untrue.
pub fn load_input(input: &Input, filter: &Filter, observe: &mut (dyn Observer + Send)) -> Result<Trace, Error> {
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
    let r = Trace::load_recovering(
        || {
            bar.set_position(0);
            bar.set_message(format!("reading {name}"));
            input.reader().map(|r| BufReader::with_capacity(1 << 20, bar.wrap_read(r)))
        },
        &|| input.recovery(),
        filter,
        observe,
    )
    .map_err(|e| Error::new(format!("{p}: {e}")));
    bar.finish_and_clear();
    match r {
        Ok(t) if t.outcome == Outcome::Truncated { offset: 0 } => Err(Error::new(unreadable(&p, len))),
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

