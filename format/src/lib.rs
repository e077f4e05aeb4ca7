//! The gpumemtrace trace format, specified in `docs/format.md`.
//!
//! The preload library encodes records with [`Encoder`]; the CLI decodes them with [`Reader`].
//! Keeping both here, next to the specification, is what keeps them in step.
//!
//! A trace is a 12-byte header followed by length-prefixed records. Every record is
//! `tag: u8, len: varint, payload: [u8; len]`, so a reader can skip tags it does not know,
//! bound its allocations by `len`, and tell a clean end (between records) from a cut one.
//!
//! Modules: `header` (magic, version, limits, tags), `records` (the record types and memory
//! kinds), `encode` (the writer's side), `decode` (the reader's), `compress` (zstd bodies).
//! None depends on a module after it in that list, but `decode` on `compress`. `fit` cuts long
//! fields to the bounds before encoding; `raw` and `journal` are what the preload library hands
//! its writer (and a reader recovers after the process died).

mod compress;
mod decode;
mod encode;
mod fit;
mod header;
pub mod journal;
pub mod raw;
mod records;
pub mod recover;

pub use compress::Compressor;
pub use decode::{ReadError, Reader};
pub use encode::{Encoder, EventState};
pub use fit::{cut, fitted, MAX_ARGS_LEN, MAX_BUILD_ID_LEN, MAX_FIELD_LEN, MAX_LINETABLE_LEN};
pub use header::*;
pub use records::*;

#[cfg(test)]
mod tests {
    use super::*;
    use encode::put_uv;

    fn sample() -> Vec<Record> {
        vec![
            Record::Process(Process {
                pid: 42,
                ppid: 1,
                start_monotonic_ns: 123456789,
                start_realtime_ns: 1_700_000_000_000_000_000,
                exe: "/usr/bin/python3".into(),
                args: vec!["python3".into(), "train.py".into()],
                max_frames: 64,
                rank: Some(0),
                local_rank: None,
            }),
            Record::Api(Api { id: 3, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }),
            Record::Module(Module {
                id: 1,
                bias: 0x7f00_0000_0000,
                start: 0x7f00_0000_1000,
                end: 0x7f00_0010_0000,
                path: "/lib/libfoo.so".into(),
                build_id: vec![0xde, 0xad, 0xbe, 0xef],
            }),
            Record::Stack(Stack { id: 1, frames: vec![0x7f00_0000_2000, 0x5555_0000_1000, 0x7f00_0000_1000] }),
            Record::Event(Event {
                api: 3,
                time_ns: 1000,
                tid: 7,
                stack: 1,
                result: 0,
                device: 0,
                addr: 0x7f00_0000_0000,
                size: 1 << 20,
                stream: 0,
                extra: 0,
                pystack: 0,
                flags: 0,
                total_allocated: 0,
                total_reserved: 0,
            }),
            // A block of a caching allocator, with its totals (version 3's trailing fields).
            Record::Event(Event {
                api: 3,
                time_ns: 990,
                addr: 0x7f00_0000_0200,
                size: 512,
                flags: event_flags::PYTHON,
                total_allocated: 1 << 20,
                total_reserved: 20 << 20,
                ..Event::default()
            }),
            // Only the flags set: the totals are left out.
            Record::Event(Event { api: 3, time_ns: 995, flags: event_flags::PYTHON, ..Event::default() }),
            Record::Event(Event { api: 3, time_ns: 900, device: -1, result: 2, size: 1 << 40, ..Event::default() }),
            Record::Notice("hello".into()),
            Record::PyCode(PyCode {
                id: 1,
                name: "forward".into(),
                qualname: "Net.forward".into(),
                filename: "train.py".into(),
                firstlineno: 10,
                linetable_format: line_table_format::PY311,
                linetable: vec![1, 2, 3],
            }),
            Record::PyStack(PyStack {
                id: 1,
                frames: vec![PyFrame { code: 1, instr_offset: 24, flags: 1 }, PyFrame { code: 1, instr_offset: 0, flags: 0 }],
            }),
            Record::Event(Event { api: 3, time_ns: 950, pystack: 1, ..Event::default() }),
            Record::Phase(Phase { time_ns: 960, tid: 7, op: PhaseOp::Push, name: "forward".into() }),
            Record::Thread(Thread { tid: 7, name: "pt_autograd_0".into(), python: false }),
            Record::Stats(Stats { events: 2, dropped: 0, final_: true }),
            Record::AggStart(AggStart { seq: 3, time_ns: 5_000_000_000, events: 1 << 33, final_: true, python_exit_ns: Some(0) }),
            Record::AggSite(AggSite {
                seq: 3,
                device: -1,
                kind: MemKind::HostPinned,
                stack: 1,
                pystack: 1,
                allocations: 100_000,
                allocated_bytes: 100_000 << 20,
                frees: 99_999,
                live_bytes: 1 << 20,
                live_count: 1,
                peak_bytes: 2 << 20,
                peak_count: 2,
                exit_bytes: 3 << 20,
                exit_count: 3,
                tid: 4242,
            }),
            Record::AggPeak(AggPeak { seq: 3, device: 0, kind: Some(MemKind::Block), bytes: 1 << 30, time_ns: 77 }),
            Record::AggPeak(AggPeak { seq: 3, device: 0, kind: None, bytes: 3 << 30, time_ns: 78 }),
            Record::AggPhase(AggPhase {
                seq: 3,
                device: 1,
                kind: MemKind::Device,
                name: "epoch 1".into(),
                allocations: 5,
                allocated_bytes: 5 << 20,
                failed: 1,
                peak_bytes: 9 << 20,
            }),
            Record::AggFailure(AggFailure { device: -1, live_bytes: 84 << 20 }),
            Record::AggEnd(3),
        ]
    }

    fn encode_all(recs: &[Record]) -> Vec<u8> {
        let mut out = header().to_vec();
        let mut enc = Encoder::new();
        for r in recs {
            enc.encode(r, &mut out);
        }
        out
    }

    #[test]
    fn a_sync_record_lets_a_reader_start_mid_stream_and_is_not_handed_out() {
        let ev = |i: u64| Event { api: 1, time_ns: 1_000_000 + 77 * i, tid: 40 + (i % 3) as u32, addr: 0x7f00_0000_0000 + 4096 * i, size: 8, ..Event::default() };
        let mut enc = Encoder::new();
        let mut skipped = Vec::new();
        for i in 0..10 {
            enc.encode(&Record::Event(ev(i)), &mut skipped);
        }
        // What a frame after a lost one holds: where the deltas stand, then events as deltas.
        let mut file = header().to_vec();
        enc.event_state().sync(&mut file);
        for i in 10..20 {
            enc.encode(&Record::Event(ev(i)), &mut file);
        }
        let back: Vec<Record> = Reader::new(&file[..]).unwrap().map(Result::unwrap).collect();
        assert_eq!(back, (10..20).map(|i| Record::Event(ev(i))).collect::<Vec<_>>());
        // Without it the deltas start from zero: every value is off.
        let mut cut = header().to_vec();
        cut.extend_from_slice(&file[HEADER_LEN + 1 + file[HEADER_LEN + 1] as usize + 1..]);
        let wrong: Vec<Record> = Reader::new(&cut[..]).unwrap().map(Result::unwrap).collect();
        assert_eq!(wrong.len(), 10);
        assert_ne!(wrong[0], Record::Event(ev(10)));
    }

    #[test]
    fn version_3_fields_cost_nothing_when_zero() {
        let ev = |e: Event| {
            let mut out = Vec::new();
            Encoder::new().encode(&Record::Event(e), &mut out);
            out.len()
        };
        let plain = ev(Event { api: 3, size: 100, ..Event::default() });
        assert_eq!(ev(Event { api: 3, size: 100, flags: 1, ..Event::default() }), plain + 1);
        assert_eq!(ev(Event { api: 3, size: 100, total_reserved: 1, ..Event::default() }), plain + 3);
    }

    #[test]
    fn every_record_survives_a_round_trip() {
        let recs = sample();
        let bytes = encode_all(&recs);
        let back: Vec<Record> = Reader::new(&bytes[..]).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(back, recs);
    }

    #[test]
    fn every_prefix_reads_cleanly_or_reports_truncation() {
        let recs = sample();
        let bytes = encode_all(&recs);
        // Offsets where a record ends: a prefix ending there reads without error.
        let mut ends = vec![HEADER_LEN];
        let mut r = Reader::new(&bytes[..]).unwrap();
        while r.next_record().unwrap().is_some() {
            ends.push(r.offset() as usize);
        }
        for cut in 0..bytes.len() {
            let prefix = &bytes[..cut];
            let mut got = 0;
            let outcome = match Reader::new(prefix) {
                Err(ReadError::Truncated { .. }) => {
                    assert!(cut < HEADER_LEN);
                    continue;
                }
                Err(e) => panic!("prefix {cut}: {e}"),
                Ok(mut rd) => loop {
                    match rd.next_record() {
                        Ok(Some(_)) => got += 1,
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                },
            };
            let complete = ends.iter().filter(|&&e| e <= cut).count() - 1;
            assert_eq!(got, complete, "prefix {cut}");
            match outcome {
                Ok(()) => assert!(ends.contains(&cut), "prefix {cut} should be reported truncated"),
                Err(ReadError::Truncated { offset }) => assert_eq!(offset as usize, ends[complete]),
                Err(e) => panic!("prefix {cut}: unexpected {e}"),
            }
        }
    }

    #[test]
    fn a_bogus_length_is_an_error_not_an_allocation() {
        let mut bytes = header().to_vec();
        bytes.push(tag::EVENT);
        put_uv(&mut bytes, u64::MAX >> 1);
        let err = Reader::new(&bytes[..]).unwrap().next_record().unwrap_err();
        assert!(matches!(err, ReadError::Corrupt { offset: 12, .. }), "{err}");
    }

    #[test]
    fn events_of_the_first_writer_without_a_python_stack_still_read() {
        // Version 1 events were first written without the trailing `pystack` field, with the
        // thread and address as plain numbers.
        let mut bytes = header().to_vec();
        bytes[8] = 1;
        bytes.extend_from_slice(&[tag::EVENT, 10, 1, 2, 3, 4, 0, 0, 5, 6, 0, 0]);
        let rec = Reader::new(&bytes[..]).unwrap().next_record().unwrap().unwrap();
        let Record::Event(e) = rec else { panic!("{rec:?}") };
        assert_eq!((e.api, e.tid, e.addr, e.size, e.pystack), (1, 3, 5, 6, 0));
    }

    #[test]
    fn unknown_tags_are_skipped() {
        let mut bytes = header().to_vec();
        bytes.extend_from_slice(&[0x7e, 3, 1, 2, 3]);
        let mut enc = Encoder::new();
        enc.encode(&Record::Notice("after".into()), &mut bytes);
        let back: Vec<Record> = Reader::new(&bytes[..]).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(back, vec![Record::Unknown(0x7e), Record::Notice("after".into())]);
    }

    #[test]
    fn wrong_magic_and_version_are_rejected() {
        assert!(matches!(Reader::new(&b"NOTATRACEFILE..."[..]), Err(ReadError::BadHeader(_))));
        let mut h = header();
        h[8] = 99;
        assert!(matches!(Reader::new(&h[..]), Err(ReadError::BadHeader(_))));
        h[8] = 0;
        assert!(matches!(Reader::new(&h[..]), Err(ReadError::BadHeader(_))));
    }

    // The module rules (layering, no cycle, file sizes): tests/architecture.rs at the
    // workspace root.

    #[test]
    fn memory_kinds_share_namespaces_and_gpu_memory_as_documented() {
        let shared: Vec<MemKind> = MemKind::ALL.into_iter().filter(|k| k.namespace() == 0).collect();
        assert_eq!(shared, [MemKind::Device, MemKind::Managed, MemKind::HostPinned]);
        let gpu: Vec<MemKind> = MemKind::ALL.into_iter().filter(|k| k.occupies_gpu()).collect();
        assert_eq!(gpu, [MemKind::Device, MemKind::Managed, MemKind::VmmPhysical]);
    }
}
