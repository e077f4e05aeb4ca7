//! The model's tests, and the builder of synthetic traces the other modules' tests use.

use super::*;
use super::trace::DeviceTotal;
pub use gpumemtrace_format::{header, Api, Encoder, Event, MemKind, Module, Op, Process, Record, Stack, Stats};

// API ids of the synthetic traces.
pub const MALLOC: u32 = 1;
pub const FREE: u32 = 2;
pub const MALLOC_MANAGED: u32 = 3;
pub const MALLOC_HOST: u32 = 4;
pub const FREE_HOST: u32 = 5;
pub const MEM_CREATE: u32 = 6;
pub const MEM_RELEASE: u32 = 7;
pub const ADDRESS_RESERVE: u32 = 8;
pub const ADDRESS_FREE: u32 = 9;
pub const MEM_MAP: u32 = 10;
pub const MEM_UNMAP: u32 = 11;

/// Builds a trace in memory: header, Process and an Api table, then whatever is added.
pub struct TraceBuilder {
    pub bytes: Vec<u8>,
    enc: Encoder,
}

impl TraceBuilder {
    pub fn new() -> TraceBuilder {
        let mut b = TraceBuilder {
            bytes: header().to_vec(),
            enc: Encoder::new(),
        };
        b.rec(Record::Process(Process {
            pid: 1234,
            ppid: 1,
            exe: "/usr/bin/demo".into(),
            args: vec!["demo".into(), "--fast".into()],
            max_frames: 32,
            ..Process::default()
        }));
        let apis = [
            (MALLOC, "cudaMalloc", MemKind::Device, Op::Alloc),
            (FREE, "cudaFree", MemKind::Device, Op::Free),
            (
                MALLOC_MANAGED,
                "cudaMallocManaged",
                MemKind::Managed,
                Op::Alloc,
            ),
            (
                MALLOC_HOST,
                "cudaMallocHost",
                MemKind::HostPinned,
                Op::Alloc,
            ),
            (FREE_HOST, "cudaFreeHost", MemKind::HostPinned, Op::Free),
            (MEM_CREATE, "cuMemCreate", MemKind::VmmPhysical, Op::Alloc),
            (MEM_RELEASE, "cuMemRelease", MemKind::VmmPhysical, Op::Free),
            (
                ADDRESS_RESERVE,
                "cuMemAddressReserve",
                MemKind::VmmReserved,
                Op::Alloc,
            ),
            (
                ADDRESS_FREE,
                "cuMemAddressFree",
                MemKind::VmmReserved,
                Op::Free,
            ),
            (MEM_MAP, "cuMemMap", MemKind::VmmMapped, Op::Alloc),
            (MEM_UNMAP, "cuMemUnmap", MemKind::VmmMapped, Op::Free),
        ];
        for (id, name, kind, op) in apis {
            b.rec(Record::Api(Api {
                id,
                name: name.into(),
                kind,
                op,
            }));
        }
        b
    }

    pub fn rec(&mut self, r: Record) -> &mut Self {
        self.enc.encode(&r, &mut self.bytes);
        self
    }

    pub fn stack(&mut self, id: u32, frames: &[u64]) -> &mut Self {
        self.rec(Record::Stack(Stack {
            id,
            frames: frames.to_vec(),
        }))
    }

    /// A successful call on device 0.
    pub fn ok(&mut self, api: u32, t: u64, addr: u64, size: u64, stack: u32) -> &mut Self {
        self.call(api, t, 0, addr, size, stack, 0)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &mut self,
        api: u32,
        t: u64,
        device: i32,
        addr: u64,
        size: u64,
        stack: u32,
        result: u32,
    ) -> &mut Self {
        self.rec(Record::Event(Event {
            api,
            time_ns: t,
            device,
            addr,
            size,
            stack,
            result,
            tid: 1,
            ..Event::default()
        }))
    }

    pub fn load(&self) -> Trace {
        Trace::load_from(|| Ok(&self.bytes[..])).unwrap()
    }
}

fn key(device: i32, kind: MemKind) -> GroupKey {
    GroupKey { device, kind }
}

fn uses(v: &[(u32, u64, u64)]) -> Vec<StackUse> {
    v.iter()
        .map(|&(stack, bytes, count)| StackUse {
            stack,
            bytes,
            count,
        })
        .collect()
}

#[test]
fn leaks_of_a_python_program_are_what_was_live_before_interpreter_shutdown() {
    // pid 1234's main thread allocates from Python (pystack != 0), then the interpreter's
    // shutdown frees module globals from C (no Python frame): the leak is what was live then.
    let py = |api, t, addr, size, stack, pystack, tid| {
        Record::Event(Event { api, time_ns: t, addr, size, stack, pystack, tid, ..Event::default() })
    };
    let mut b = TraceBuilder::new();
    b.rec(py(MALLOC, 10, 0x1000, 100, 1, 1, 1234))
        .rec(py(MALLOC, 20, 0x2000, 50, 2, 2, 1234))
        .rec(py(MALLOC, 25, 0x3000, 7, 3, 0, 99)) // another thread, no Python: not shutdown
        .rec(py(FREE, 30, 0x2000, 0, 2, 2, 1234)) // freed by the program itself
        .rec(py(FREE, 40, 0x1000, 0, 4, 0, 1234)) // shutdown starts here
        .rec(py(FREE, 41, 0x3000, 0, 4, 0, 1234));
    let t = b.load();
    assert_eq!(t.python_exit_ns, Some(40));
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!(g.live_at_python_exit, Some((107, 2)));
    assert_eq!(g.leak_stacks.iter().map(|u| (u.bytes, u.count)).collect::<Vec<_>>(), [(100, 1), (7, 1)]);
    assert_eq!((g.live_bytes, g.live_count), (0, 0), "the end of the trace still says what it says");

    // No Python stacks at all: leaks are the end of the trace, as for any program.
    let mut b = TraceBuilder::new();
    b.rec(py(MALLOC, 10, 0x1000, 100, 1, 0, 1234)).rec(py(FREE, 40, 0x1000, 0, 4, 0, 1234));
    let t = b.load();
    assert_eq!(t.python_exit_ns, None);
    assert_eq!(t.groups[&key(0, MemKind::Device)].live_at_python_exit, None);
}

#[test]
fn peak_and_leaks_per_group_with_address_reuse() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 10, 0x1000, 100, 1)
        .ok(MALLOC, 20, 0x2000, 200, 2) // 300 live
        .ok(FREE, 30, 0x1000, 0, 9) // 200
        .ok(MALLOC, 40, 0x1000, 50, 1) // 250: the address is reused
        .ok(MALLOC, 50, 0x3000, 150, 3) // 400: the peak
        .ok(FREE, 60, 0x2000, 0, 9) // 200
        .ok(MALLOC, 70, 0x4000, 200, 4); // 400 again: not a new peak
    let t = b.load();
    assert_eq!(t.outcome, Outcome::Complete);
    assert_eq!(t.events, 7);
    assert_eq!(t.groups.len(), 1);
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!(
        (
            g.allocations,
            g.allocated_bytes,
            g.frees,
            g.failed,
            g.double_allocs
        ),
        (5, 700, 2, 0, 0)
    );
    assert_eq!((g.peak_bytes, g.peak_time_ns), (400, 50));
    assert_eq!(g.peak_stacks, uses(&[(2, 200, 1), (3, 150, 1), (1, 50, 1)]));
    assert_eq!((g.live_bytes, g.live_count), (400, 3));
    assert_eq!(g.leak_stacks, uses(&[(4, 200, 1), (3, 150, 1), (1, 50, 1)]));
    assert_eq!(
        t.devices[&0],
        DeviceTotal {
            peak_bytes: 400,
            peak_time_ns: 50,
            live_bytes: 400
        }
    );
    assert!(t.bad_frees.is_empty());
}

#[test]
fn groups_peak_separately() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1)
        .call(MALLOC, 2, 1, 0x2000, 300, 2, 0) // device 1
        .ok(FREE, 3, 0x1000, 0, 0)
        .ok(MALLOC, 4, 0x3000, 60, 3)
        .ok(MALLOC, 5, 0x4000, 60, 3) // device 0 peaks at 120 here
        .call(FREE, 6, 1, 0x2000, 0, 0, 0);
    let t = b.load();
    let d0 = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((d0.peak_bytes, d0.peak_time_ns), (120, 5));
    assert_eq!(d0.peak_stacks, uses(&[(3, 120, 2)]));
    let d1 = &t.groups[&key(1, MemKind::Device)];
    assert_eq!((d1.peak_bytes, d1.peak_time_ns, d1.live_bytes), (300, 2, 0));
    assert_eq!(d1.peak_stacks, uses(&[(2, 300, 1)]));
    assert!(d1.leak_stacks.is_empty());
}

#[test]
fn cuda_free_frees_managed_memory() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC_MANAGED, 1, 0x5000, 64, 1)
        .ok(MALLOC, 2, 0x6000, 32, 2)
        .ok(MALLOC_HOST, 3, 0x7000, 1000, 3)
        .call(FREE, 4, -1, 0x5000, 0, 0, 0); // the free's own device does not matter
    let t = b.load();
    let m = &t.groups[&key(0, MemKind::Managed)];
    assert_eq!(
        (m.allocations, m.frees, m.peak_bytes, m.live_bytes),
        (1, 1, 64, 0)
    );
    let d = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((d.allocations, d.frees, d.live_bytes), (1, 0, 32));
    // Pinned host memory is not GPU memory.
    assert_eq!(
        t.devices[&0],
        DeviceTotal {
            peak_bytes: 96,
            peak_time_ns: 2,
            live_bytes: 32
        }
    );
    assert!(t.bad_frees.is_empty());
}

#[test]
fn unknown_and_failed_frees_are_listed() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 10, 1)
        .ok(FREE, 2, 0x9999, 0, 5) // never allocated
        .ok(FREE, 3, 0, 0, 6) // cudaFree(NULL): a no-op
        .call(FREE, 4, 0, 0x1000, 0, 7, 400) // failed: the memory stays live
        .ok(FREE_HOST, 5, 0x1000, 0, 0); // same namespace: frees the device pointer
    let t = b.load();
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.frees, g.live_bytes), (1, 0));
    let got: Vec<_> = t
        .bad_frees
        .iter()
        .map(|f| (f.api.as_str(), f.addr, f.result, f.time_ns, f.stack))
        .collect();
    assert_eq!(
        got,
        [
            ("cudaFree", 0x9999, 0, 2, 5),
            ("cudaFree", 0x1000, 400, 4, 7)
        ]
    );
}

#[test]
fn failed_alloc_records_live_gpu_memory_of_its_device() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1)
        .ok(MEM_CREATE, 2, 0x10, 300, 2) // VMM physical memory counts
        .ok(ADDRESS_RESERVE, 3, 0x2000_0000, 1 << 30, 3) // reservations do not
        .call(MALLOC, 4, 1, 0x2000, 50, 4, 0) // other device
        .ok(MALLOC_HOST, 5, 0x3000, 70, 5)
        .call(MALLOC, 6, 0, 0, 1 << 40, 6, 2);
    let t = b.load();
    assert_eq!(
        t.failures,
        [Failure {
            api: "cudaMalloc".into(),
            device: 0,
            kind: MemKind::Device,
            size: 1 << 40,
            result: 2,
            time_ns: 6,
            stack: 6,
            live_bytes_on_device: 400,
            pool: None,
            ordinal: 6,
        }]
    );
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.allocations, g.failed, g.live_bytes), (1, 1, 100));
    // The post-mortem: device 0's GPU memory as the last allocation failed.
    let live: Vec<(MemKind, u64)> =
        t.last_failure_live.iter().map(|(k, v)| (k.kind, v.iter().map(|u| u.bytes).sum())).collect();
    assert_eq!(live, [(MemKind::Device, 100), (MemKind::VmmPhysical, 300)]);
}

#[test]
fn the_post_mortem_is_of_the_last_out_of_memory_not_of_a_probe() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1)
        .call(MALLOC, 2, 0, 0, 1 << 40, 2, 2) // out of memory: 100 B live
        .ok(MALLOC, 3, 0x2000, 50, 3)
        .call(MEM_CREATE, 4, 0, 0, 2 << 20, 4, 800); // PyTorch's probe, later
    let t = b.load();
    assert_eq!(t.failures.len(), 2);
    assert_eq!(t.failures.iter().map(Failure::counts).collect::<Vec<_>>(), [true, false]);
    let live: Vec<u64> = t.last_failure_live.iter().flat_map(|(_, v)| v.iter().map(|u| u.bytes)).collect();
    assert_eq!(live, [100]);
    // Only a probe: no post-mortem.
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1).call(MEM_CREATE, 2, 0, 0, 2 << 20, 4, 800);
    assert!(b.load().last_failure_live.is_empty());
}

#[test]
fn vmm_namespaces_are_independent() {
    let mut b = TraceBuilder::new();
    b.ok(MEM_CREATE, 1, 0x10000, 2 << 20, 1) // handle 0x10000
        .ok(ADDRESS_RESERVE, 2, 0x10000, 4 << 20, 2) // VA 0x10000
        .ok(MEM_MAP, 3, 0x10000, 2 << 20, 3)
        .ok(MALLOC, 4, 0x10000, 1 << 20, 4)
        .ok(MEM_UNMAP, 5, 0x10000, 2 << 20, 0)
        .ok(MEM_RELEASE, 6, 0x10000, 0, 0);
    let t = b.load();
    let live = |kind| {
        let g = &t.groups[&key(0, kind)];
        assert_eq!(g.double_allocs, 0, "{kind:?}");
        (g.allocations, g.frees, g.live_bytes)
    };
    assert_eq!(live(MemKind::VmmPhysical), (1, 1, 0));
    assert_eq!(live(MemKind::VmmReserved), (1, 0, 4 << 20));
    assert_eq!(live(MemKind::VmmMapped), (1, 1, 0));
    assert_eq!(live(MemKind::Device), (1, 0, 1 << 20));
    assert!(t.bad_frees.is_empty());
    assert_eq!(t.devices[&0].peak_bytes, 3 << 20);
}

#[test]
fn a_free_written_after_its_address_was_reused_frees_the_older_allocation() {
    // Thread A allocates X at t=1 and frees it at t=2 (time taken before the real free);
    // thread B gets X back at t=3, and B's event reaches the trace before A's free.
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1).ok(MALLOC, 3, 0x1000, 40, 2).ok(FREE, 2, 0x1000, 0, 3);
    let t = b.load();
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.allocations, g.frees, g.double_allocs, g.live_bytes, g.live_count), (2, 1, 0, 40, 1));
    assert_eq!(g.leak_stacks, uses(&[(2, 40, 1)]));
    assert!(t.bad_frees.is_empty());

    // The same, with B's own free reaching the trace before A's late one.
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1)
        .ok(MALLOC, 3, 0x1000, 40, 2)
        .ok(FREE, 4, 0x1000, 0, 3)
        .ok(FREE, 2, 0x1000, 0, 3);
    let t = b.load();
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.frees, g.live_bytes, g.live_count), (2, 0, 0));
    assert!(t.bad_frees.is_empty());
}

#[test]
fn a_zero_byte_allocation_that_succeeds_with_null_holds_nothing_and_displaces_nothing() {
    // cudaMalloc(&p, 0) returns success and p = NULL (PyTorch's empty tensors without its cache).
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0, 0, 1).ok(MALLOC, 2, 0, 0, 1).ok(MALLOC, 3, 0x1000, 40, 2);
    let t = b.load();
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.allocations, g.double_allocs, g.live_bytes, g.live_count), (1, 0, 40, 1));
    assert!(t.bad_frees.is_empty());
}

#[test]
fn an_address_allocated_twice_without_a_free_keeps_both_and_says_so() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1).ok(MALLOC, 2, 0x1000, 40, 2);
    let t = b.load();
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.allocations, g.double_allocs, g.live_bytes, g.live_count, g.peak_bytes), (2, 1, 140, 2, 140));
    assert_eq!(g.leak_stacks, uses(&[(1, 100, 1), (2, 40, 1)]));
}

#[test]
fn truncated_trace_yields_its_prefix() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1)
        .ok(MALLOC, 2, 0x2000, 200, 2);
    let cut_at = b.bytes.len() as u64;
    b.ok(MALLOC, 3, 0x3000, 300, 3);
    let bytes = &b.bytes[..b.bytes.len() - 2];
    let t = Trace::load_from(|| Ok(bytes)).unwrap();
    assert_eq!(t.outcome, Outcome::Truncated { offset: cut_at });
    assert_eq!(t.events, 2);
    let g = &t.groups[&key(0, MemKind::Device)];
    assert_eq!((g.allocations, g.peak_bytes, g.live_bytes), (2, 300, 300));
    assert_eq!(g.peak_stacks, uses(&[(2, 200, 1), (1, 100, 1)]));
    assert_eq!(t.process.as_ref().unwrap().pid, 1234);

    // A tracer that died before writing anything leaves an empty file.
    let t = Trace::load_from(|| Ok(&[][..])).unwrap();
    assert_eq!((t.outcome, t.events), (Outcome::Truncated { offset: 0 }, 0));
}

#[test]
fn corrupt_trace_reports_the_offset() {
    let mut b = TraceBuilder::new();
    b.ok(MALLOC, 1, 0x1000, 100, 1);
    let bad_at = b.bytes.len() as u64;
    // An Api record with memory kind 99.
    b.bytes
        .extend_from_slice(&[gpumemtrace_format::tag::API, 4, 7, 1, b'x', 99]);
    b.ok(MALLOC, 2, 0x2000, 200, 2); // never read
    let t = b.load();
    assert_eq!(
        t.outcome,
        Outcome::Corrupt {
            offset: bad_at,
            message: "unknown memory kind 99".into()
        }
    );
    assert_eq!(t.events, 1);
    assert_eq!(t.groups[&key(0, MemKind::Device)].live_bytes, 100);
}

#[test]
fn a_file_that_is_not_a_trace_is_an_error() {
    let err = Trace::load_from(|| Ok(&b"#!/bin/sh\necho hello\n"[..])).unwrap_err();
    assert!(err.to_string().contains("not a gpumemtrace trace"), "{err}");
}

#[test]
fn records_besides_events_are_kept() {
    let mut b = TraceBuilder::new();
    b.stack(1, &[0x10, 0x20])
        .rec(Record::Module(Module {
            id: 1,
            path: "/lib/x.so".into(),
            ..Module::default()
        }))
        .rec(Record::Notice("stack capture disabled".into()))
        .rec(Record::Event(Event {
            api: 77,
            ..Event::default()
        }))
        .rec(Record::Stats(Stats {
            events: 1,
            dropped: 3,
            final_: true,
        }));
    let t = b.load();
    assert_eq!(t.stacks[&1], [0x10, 0x20]);
    assert_eq!(t.modules.len(), 1);
    assert_eq!(t.notices, ["stack capture disabled"]);
    assert_eq!((t.events, t.unknown_api_events), (1, 1));
    assert_eq!(t.stats.unwrap().dropped, 3);
    assert_eq!(t.apis[&MALLOC].name, "cudaMalloc");
}

#[test]
fn values_no_process_has_are_called_implausible_and_real_ones_are_not() {
    let plausible = |b: &mut TraceBuilder| b.ok(MALLOC, 10, 0x1000, 80 << 30, 1).call(MALLOC, 20, 3, 0x2000, 1 << 20, 1, 0).ok(FREE, 30, 0x1000, 0, 1).load();
    assert_eq!(plausible(&mut TraceBuilder::new()).implausible(), None);
    // A failed request may ask for anything: not a finding about the trace.
    assert_eq!(TraceBuilder::new().ok(MALLOC, 10, 0x1000, 1 << 30, 1).call(MALLOC, 11, 0, 0, u64::MAX, 1, 2).load().implausible(), None);
    let bytes = TraceBuilder::new().ok(MALLOC, 10, 0x1000, 1 << 57, 1).load().implausible().unwrap();
    assert!(bytes.contains("more than any address space") && bytes.contains("likely corrupt"), "{bytes}");
    let late = TraceBuilder::new().ok(MALLOC, 1 << 62, 0x1000, 4096, 1).load().implausible().unwrap();
    assert!(late.contains("after the clock's zero"), "{late}");
    let device = TraceBuilder::new().call(MALLOC, 10, 70_000, 0x1000, 4096, 1, 0).load().implausible().unwrap();
    assert!(device.contains("device number 70000"), "{device}");
}

#[test]
fn a_reports_warnings_say_where_reading_stopped_and_what_no_process_does() {
    let mut t = TraceBuilder::new().ok(MALLOC, 10, 0x1000, 1 << 57, 1).load();
    assert_eq!(t.warnings("the summary").len(), 1, "implausible values alone");
    t.outcome = Outcome::Truncated { offset: 1337 };
    let w = t.warnings("the summary");
    assert_eq!(w.len(), 2);
    assert_eq!(w[0], "the trace is truncated at byte 1337 (the process may have been killed); the summary covers the events before it");
    assert!(w[1].contains("likely corrupt"));
    let mut t = TraceBuilder::new().ok(MALLOC, 10, 0x1000, 4096, 1).load();
    assert!(t.warnings("this report").is_empty());
    assert!(!t.is_damaged());
    t.outcome = Outcome::Corrupt { offset: 7, message: "bad record type 200".into() };
    assert_eq!(t.warnings("this report"), ["the trace is corrupt at byte 7 (bad record type 200); this report covers the events before it"]);
    assert!(t.is_damaged());
    // Read to its end past a damaged compressed frame: that frame's records are missing.
    t.outcome = Outcome::Complete;
    t.damaged = vec![(4096, "compressed body: Restored data doesn't match checksum".into())];
    assert_eq!(
        t.warnings("the summary"),
        ["the trace is corrupt in the compressed frame from byte 4096 (compressed body: Restored data doesn't match checksum): its records are left out, and the summary misses them (reading went on at the next frame)"]
    );
    assert!(t.is_damaged());
}
