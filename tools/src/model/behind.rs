//! The model's own observers (`groups`, with its pools, growth and snapshots, and `timeseries`)
//! run on a thread of their own, a few batches behind the replay. They were half of the loading
//! thread's work per event, and the replay cannot be split (each event changes the live set the
//! next one reads), so a summary of 10^8 events now takes the longest of three stages (reading,
//! replaying, observing), not the sum of the last two.
//!
//! The caller's observer (the summary's temporary allocations, an exporter's collector) goes
//! with them. The replay hands over owned copies of its steps, in order, with the few moments the
//! observers must know of at the exact point in the stream (the Python program's end, the pools'
//! seed, an aggregate trace's failure detail) and the names steps refer to (APIs, phases) as
//! messages of their own between them: an observer sees the same steps on either thread.

use std::collections::BTreeMap;

use crossbeam_channel::{Receiver, Sender};
use gpumemtrace_format::Event;

use super::groups::Groups;
use super::pool::{Pool, Seed};
use super::timeseries::TimeSeries;
use crate::read::live::GroupKey;
use crate::read::replay::{Observer, Step, StepKind};

/// Messages a batch holds (about 20 KiB): batches in flight stay in the caches the two
/// threads share; 1024 a batch cost a third more time in all.
const BATCH: usize = 128;
/// Batches in flight: enough to ride out a slow stretch on either side.
const AHEAD: usize = 6;

/// What the observers hold when the replay is done.
pub struct Observed<'a> {
    pub groups: Groups,
    pub series: TimeSeries,
    /// The pools when the Python program ended (see [`Feed::python_exit`]).
    pub pools_at_python_exit: BTreeMap<i32, Pool>,
    /// The caller's observer, after the model's own.
    extra: &'a mut (dyn Observer + Send),
    /// The names steps refer to, as the replay's: APIs by id, phases by id.
    apis: crate::read::byid::ById<Box<str>>,
    phases: Vec<Box<str>>,
}

impl<'a> Observed<'a> {
    pub fn new(extra: &'a mut (dyn Observer + Send)) -> Observed<'a> {
        Observed {
            groups: Groups::default(),
            series: TimeSeries::default(),
            pools_at_python_exit: BTreeMap::new(),
            extra,
            apis: Default::default(),
            phases: Vec::new(),
        }
    }

    fn step(&mut self, s: &Step) {
        self.groups.step(s);
        self.series.step(s);
        self.extra.step(s);
    }

    fn take(&mut self, m: &mut Msg) {
        match m {
            Msg::Step(s) => {
                let api = self.apis.get(s.event.api).map_or("", |n| n);
                let phase = s.phase_id.and_then(|i| self.phases.get(i as usize)).map(|n| &**n);
                let step = s.as_step(api, phase);
                self.groups.step(&step);
                self.series.step(&step);
                self.extra.step(&step);
            }
            Msg::Api { id, name } => {
                self.apis.insert(*id, std::mem::take(name));
            }
            Msg::Phase(name) => self.phases.push(std::mem::take(name)),
            Msg::PythonExit => {
                self.groups.snapshots.python_exit();
                self.pools_at_python_exit = self.groups.pools.by_device.clone();
            }
            Msg::Seed(seeds) => self.groups.pools.seed(std::mem::take(seeds).into_iter()),
            Msg::AggFailure { device, live_bytes } => {
                if let Some(f) = self.groups.failures.last_mut().filter(|f| f.device == *device) {
                    f.live_bytes_on_device = *live_bytes;
                }
            }
        }
    }
}

// Steps are nearly every message: kept inline, not boxed (an allocation each).
#[allow(clippy::large_enum_variant)]
enum Msg {
    Step(OwnedStep),
    PythonExit,
    Seed(Vec<Seed>),
    AggFailure { device: i32, live_bytes: u64 },
    /// The API `id`'s name (an `Api` record).
    Api { id: u32, name: Box<str> },
    /// The next phase id's name.
    Phase(Box<str>),
}

/// A [`Step`] that can cross to the observers' thread: the fields a step copies from its event
/// are taken from the event again, names from the observers' copies of the replay's.
struct OwnedStep {
    event: Event,
    key: GroupKey,
    kind: StepKind,
    group: u32,
    alloc_stack: u32,
    phase_id: Option<u32>,
    size: u64,
    group_live: u64,
    device_live: u64,
    ordinal: u64,
}

impl OwnedStep {
    fn of(s: &Step) -> OwnedStep {
        OwnedStep {
            event: *s.event,
            key: s.key,
            kind: s.kind,
            group: s.group,
            alloc_stack: s.alloc_stack,
            phase_id: s.phase_id,
            size: s.size,
            group_live: s.group_live,
            device_live: s.device_live,
            ordinal: s.ordinal,
        }
    }

    fn as_step<'a>(&'a self, api: &'a str, phase: Option<&'a str>) -> Step<'a> {
        let e = &self.event;
        Step {
            kind: self.kind,
            event: e,
            time_ns: e.time_ns,
            key: self.key,
            group: self.group,
            addr: e.addr,
            size: self.size,
            stack: e.stack,
            alloc_stack: self.alloc_stack,
            stream: e.stream,
            tid: e.tid,
            result: e.result,
            api,
            phase_id: self.phase_id,
            phase,
            group_live: self.group_live,
            device_live: self.device_live,
            ordinal: self.ordinal,
        }
    }
}

/// The replay's side: an [`Observer`] that hands steps over (or, inline, shows them to the
/// observers at once), and the other messages.
pub struct Feed<'a> {
    sink: Sink<'a>,
    /// Whether the last step was a failed allocation (the observers recorded a failure).
    pub last_failed: bool,
}

enum Sink<'a> {
    Inline(Box<Observed<'a>>),
    Thread { full: Option<Sender<Vec<Msg>>>, empty: Receiver<Vec<Msg>>, batch: Vec<Msg> },
}

impl Feed<'_> {
    // Inlined: a step is then built in place, not copied through a call (about 160 bytes).
    #[inline(always)]
    fn push(&mut self, mut m: Msg) {
        match &mut self.sink {
            Sink::Inline(observed) => observed.take(&mut m),
            Sink::Thread { batch, .. } => {
                batch.push(m);
                if batch.len() == BATCH {
                    self.flush();
                }
            }
        }
    }

    #[inline(never)]
    fn flush(&mut self) {
        if let Sink::Thread { full, empty, batch } = &mut self.sink {
            let next = empty.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH));
            let done = std::mem::replace(batch, next);
            // The observers' thread only stops early by panicking: its join reports that.
            if let Some(tx) = full {
                let _ = tx.send(done);
            }
        }
    }

    /// The Python program ended here: the snapshots and pools keep what is live now.
    pub fn python_exit(&mut self) {
        self.push(Msg::PythonExit);
    }

    /// The lazy pools learn the driver ranges live now (see `Pools::seed`).
    pub fn seed(&mut self, seeds: Vec<Seed>) {
        self.push(Msg::Seed(seeds));
    }

    /// An aggregate trace's detail of the failure just replayed: what was live on its device.
    pub fn agg_failure(&mut self, device: i32, live_bytes: u64) {
        self.push(Msg::AggFailure { device, live_bytes });
    }

    /// API `id` is named `name` (steps behind name it so).
    pub fn api(&mut self, id: u32, name: &str) {
        if let Sink::Thread { .. } = self.sink {
            self.push(Msg::Api { id, name: name.into() });
        }
    }

    /// The replay named phases up to `names` (steps behind name them so): `sent` of them
    /// were handed over before.
    pub fn phases(&mut self, names: &[String], sent: &mut usize) {
        if let Sink::Thread { .. } = self.sink {
            for n in &names[*sent..] {
                self.push(Msg::Phase(n.as_str().into()));
            }
        }
        *sent = names.len();
    }
}

impl Observer for Feed<'_> {
    fn step(&mut self, s: &Step) {
        self.last_failed = s.kind == StepKind::FailedAlloc;
        match &mut self.sink {
            Sink::Inline(observed) => observed.step(s),
            Sink::Thread { .. } => self.push(Msg::Step(OwnedStep::of(s))),
        }
    }
}

/// Whether the observers get a thread of their own: only where a core is free for it beside the
/// reader's and the replay's (on two cores the third thread costs more than it takes off; the
/// model is the same either way). `GPUMEMTRACE_MODEL_THREAD=1` or `0` decides instead.
pub fn threaded() -> bool {
    match std::env::var("GPUMEMTRACE_MODEL_THREAD").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => std::thread::available_parallelism().is_ok_and(|n| n.get() >= 3),
    }
}

/// Runs `replay` with a [`Feed`] whose steps `observed` follows, on a thread of its own where
/// `thread`; returns what `replay` returned and the observers' state once every step reached them.
pub fn behind<'a, T>(mut observed: Observed<'a>, thread: bool, replay: impl FnOnce(&mut Feed<'a>) -> T) -> (T, Observed<'a>) {
    if !thread {
        let mut feed = Feed { sink: Sink::Inline(Box::new(observed)), last_failed: false };
        let out = replay(&mut feed);
        let Sink::Inline(observed) = feed.sink else { unreachable!("the feed was made inline") };
        return (out, *observed);
    }
    let (full_tx, full_rx) = crossbeam_channel::bounded::<Vec<Msg>>(AHEAD);
    // Emptied batches go back, so the steady state allocates no batch.
    let (empty_tx, empty_rx) = crossbeam_channel::bounded::<Vec<Msg>>(AHEAD);
    std::thread::scope(|scope| {
        let observing = scope.spawn(move || {
            while let Ok(mut batch) = full_rx.recv() {
                // By reference: moving each message out would copy it once more.
                for m in batch.iter_mut() {
                    observed.take(m);
                }
                batch.clear();
                let _ = empty_tx.try_send(batch);
            }
            observed
        });
        // A panic in `replay` drops the feed, and with it the sender: the observers stop.
        let mut feed = Feed {
            sink: Sink::Thread { full: Some(full_tx), empty: empty_rx, batch: Vec::with_capacity(BATCH) },
            last_failed: false,
        };
        let out = replay(&mut feed);
        feed.flush();
        drop(feed);
        let observed = observing.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (out, observed)
    })
}
