//! Bad input, as a reader meets it: traces cut anywhere, corrupt bytes, compressed frames
//! damaged on disk. Every prefix reads up to its last complete record, every corrupt byte is
//! reported with its offset (never a panic), a damaged frame costs only its own records, and the
//! exit statuses say so.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

use gpumemtrace_format::{ReadError, Reader, Record};

/// Offsets just past each complete record of a trace file.
fn record_ends(bytes: &[u8]) -> Vec<u64> {
    let mut r = Reader::new(bytes).unwrap();
    let mut ends = vec![r.offset()];
    while r.next_record().unwrap().is_some() {
        ends.push(r.offset());
    }
    ends
}

#[test]
fn every_prefix_of_a_real_trace_reads_up_to_its_last_complete_record() {
    let run = run_traced("prog_driver", &[], &[("GPUMEMTRACE_COMPRESS", "0")]);
    let bytes = std::fs::read(&run.traces[0]).unwrap();
    let ends = record_ends(&bytes);
    for cut in gpumemtrace_format::HEADER_LEN..bytes.len() {
        let mut r = Reader::new(&bytes[..cut]).unwrap();
        let mut n = 0;
        let outcome = loop {
            match r.next_record() {
                Ok(Some(_)) => n += 1,
                Ok(None) => break None,
                Err(e) => break Some(e),
            }
        };
        let complete = ends.iter().filter(|&&e| e as usize <= cut).count() - 1;
        assert_eq!(n, complete, "cut at {cut}");
        match outcome {
            None => assert!(ends.contains(&(cut as u64))),
            Some(ReadError::Truncated { offset }) => assert_eq!(offset, ends[complete]),
            Some(e) => panic!("cut at {cut}: {e}"),
        }
    }
}

#[test]
fn every_prefix_of_a_compressed_trace_reads_a_prefix_of_its_records() {
    // The default: records in a zstd stream. A cut anywhere gives the records before it, in
    // order, and then a clean end or a cut record, never garbage.
    let run = run_traced("prog_driver", &[], &[]);
    let bytes = std::fs::read(&run.traces[0]).unwrap();
    assert_eq!(u16::from_le_bytes([bytes[10], bytes[11]]), gpumemtrace_format::flags::ZSTD);
    let all: Vec<_> = Reader::new(&bytes[..]).unwrap().map(|r| r.unwrap()).collect();
    assert!(matches!(all.last(), Some(gpumemtrace_format::Record::Stats(s)) if s.final_), "{:?}", all.last());
    let mut prev = 0;
    for cut in gpumemtrace_format::HEADER_LEN..bytes.len() {
        let mut got = Vec::new();
        for r in Reader::new(&bytes[..cut]).unwrap() {
            match r {
                Ok(rec) => got.push(rec),
                Err(ReadError::Truncated { .. }) => break,
                Err(e) => panic!("cut at {cut}: {e}"),
            }
        }
        assert_eq!(got[..], all[..got.len()], "cut at {cut}");
        assert!(got.len() >= prev, "cut at {cut}: fewer records than a shorter prefix gave");
        prev = got.len();
    }
}

fn cli_summary(path: &Path) -> std::process::Output {
    Command::new(cli()).arg("summary").arg("--json").arg(path).output().unwrap()
}

#[test]
fn the_cli_summarizes_cut_traces_and_says_where_they_stop() {
    let run = run_traced("prog_driver", &[], &[]);
    let bytes = std::fs::read(&run.traces[0]).unwrap();
    let dir = scratch("cut");
    for cut in (gpumemtrace_format::HEADER_LEN..bytes.len()).step_by(97) {
        let p = dir.join(format!("cut-{cut}.trace"));
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let out = cli_summary(&p);
        assert!(out.status.success(), "cut {cut}: {}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let t = &json["traces"][0];
        if t["status"] == "truncated" {
            assert!(t["stopped_at"].as_u64().unwrap() <= cut as u64);
            assert!(String::from_utf8_lossy(&out.stderr).contains("byte"), "a warning names the offset");
        } else {
            assert_eq!(t["status"], "complete", "cut {cut}");
        }
    }
}

#[test]
fn corrupt_bytes_give_an_error_with_an_offset_never_a_panic() {
    let run = run_traced("prog_driver", &[], &[]);
    let bytes = std::fs::read(&run.traces[0]).unwrap();
    let dir = scratch("corrupt");
    // The summary of the trace as written, without its path.
    let figures = |out: &std::process::Output| {
        let mut json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["traces"][0].as_object_mut().unwrap().remove("path");
        json
    };
    let whole = figures(&cli_summary(&run.traces[0]));
    let (mut flips, mut found, mut first_found) = (0, 0, None);
    for (i, pos) in (gpumemtrace_format::HEADER_LEN..bytes.len()).step_by(53).enumerate() {
        let mut b = bytes.clone();
        b[pos] ^= 0xff;
        let p = dir.join(format!("corrupt-{i}.trace"));
        std::fs::write(&p, &b).unwrap();
        let out = cli_summary(&p);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "flip at {pos}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "flip at {pos}");
        flips += 1;
        let t = figures(&out)["traces"][0].clone();
        // Stopped at bytes the reader refuses, or read past a damaged compressed frame left out.
        if t["status"] == "corrupt" || t["status"] == "damaged" {
            found += 1;
            first_found.get_or_insert(p.clone());
            assert!(t["error"].as_str().unwrap().contains("byte"), "{t}");
            assert!(stderr.contains("the trace is corrupt") && stderr.contains("byte"), "a warning names the offset: {stderr}");
            // The summary of what came before the damage, and an exit status that says so.
            assert_eq!(out.status.code(), Some(1), "flip at {pos}");
        } else {
            // A process that ended cleanly ended its last compressed frame: every byte of the
            // trace is under a checksum, so a changed byte that is not reported changed nothing.
            assert_eq!(t, whole["traces"][0], "flip at {pos} changed the figures silently");
            assert!(out.status.success(), "flip at {pos}");
        }
    }
    assert!(found * 100 >= flips * 95, "{found} of {flips} flipped bytes reported");
    // A CI gate does not pass a damaged trace: its budgets cannot be judged (exit 2).
    let out = Command::new(cli()).args(["check", "--max-peak", "1TiB"]).arg(first_found.unwrap()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be judged"), "{}", String::from_utf8_lossy(&out.stderr));
    // A file that is not a trace at all.
    let p = dir.join("not-a-trace.trace");
    std::fs::write(&p, b"hello world, this is not a trace").unwrap();
    let out = cli_summary(&p);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a gpumemtrace trace"));
}

#[test]
fn a_damaged_compressed_frame_loses_its_own_records_and_reading_goes_on_after_it() {
    // 400000 events: several 1 MiB frames of records.
    let run = run_traced("prog_threads", &["1", "200000"], &[]);
    let bytes = std::fs::read(&run.traces[0]).unwrap();
    let magic = [0x28, 0xb5, 0x2f, 0xfd];
    let starts: Vec<usize> = (gpumemtrace_format::HEADER_LEN..bytes.len() - 4).filter(|&i| bytes[i..i + 4] == magic).collect();
    assert!(starts.len() >= 3, "frames at {starts:?}");
    let whole = summary_json(&run.traces[0]);
    let whole = &whole["traces"][0];
    // A byte in the middle of the second frame.
    let mut b = bytes.clone();
    b[(starts[1] + starts[2]) / 2] ^= 0xff;
    let p = scratch("damaged-frame").join("damaged.trace");
    std::fs::write(&p, &b).unwrap();
    let out = cli_summary(&p);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = &json["traces"][0];
    assert_eq!(t["status"], "damaged", "{}", t["error"]);
    assert!(t["error"].as_str().unwrap().contains(&format!("the frame from byte {}", starts[1])), "{}", t["error"]);
    // That frame's events are missing (about a sixth of them), and only they: the frames after
    // it decode as written (their event deltas start from their Sync record), so every other
    // allocation still meets its free at the same address. Without the Sync record every
    // address after the gap would be off, every free unknown and every allocation a leak.
    let (all, read) = (whole["events"].as_u64().unwrap(), t["events"].as_u64().unwrap());
    assert!(read < all && read > all / 2, "{read} of {all} events");
    let allocs = |t: &serde_json::Value| t["groups"].as_array().unwrap().iter().map(|g| g["allocations"].as_u64().unwrap()).sum::<u64>();
    let live = |t: &serde_json::Value| t["groups"].as_array().unwrap().iter().map(|g| g["live_count"].as_u64().unwrap()).sum::<u64>();
    assert!(allocs(t) < allocs(whole), "{} of {}", allocs(t), allocs(whole));
    assert!(live(t) <= live(whole) + 1, "{} live against {}", live(t), live(whole));
    assert!(t["unknown_frees"].as_array().unwrap().len() <= 1, "{}", t["unknown_frees"]);
    let out = Command::new(cli()).args(["check", "--max-peak", "1TiB"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(cli()).arg("dump").arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let last = String::from_utf8_lossy(&out.stdout).lines().last().unwrap().to_owned();
    assert!(last.contains("damaged") && last.contains(&starts[1].to_string()), "{last}");
    // Record for record: the events read are the trace's, but for one run of them (the
    // damaged frame's), times, threads and addresses exact after the gap too.
    let events = |bytes: &[u8]| -> Vec<gpumemtrace_format::Event> {
        Reader::new(bytes).unwrap().filter_map(|r| match r.unwrap() {
            Record::Event(e) => Some(e),
            _ => None,
        })
        .collect()
    };
    let (all, read) = (events(&bytes), events(&b));
    let before = all.iter().zip(&read).take_while(|(a, b)| a == b).count();
    let after = all.iter().rev().zip(read.iter().rev()).take_while(|(a, b)| a == b).count();
    assert!(before > 0 && after > 0 && before + after == read.len(), "{before} + {after} of {} events", read.len());
}
