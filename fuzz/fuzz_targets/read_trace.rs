//! Arbitrary bytes into the trace reader: it must return records or an error with an offset,
//! never panic, never loop, never allocate more than a record's bounded length. Then into the
//! summary (model, observers, report, merged view, text and JSON): never a panic, arithmetic
//! overflow included, whatever values the records carry. (`reports.rs` runs the other reports,
//! a few dozen times slower an input.)
#![no_main]

use gpumemtrace_format::{flags, ReadError, Reader, Record, MAX_RECORD_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // A reader exists only for a whole header (12 bytes).
    let Ok(mut reader) = Reader::new(data) else { return };
    // In a zstd body records have no file position of their own: the offset is how far the file
    // has been read, which moves by whole chunks and not at every record.
    let version = u16::from_le_bytes([data[8], data[9]]);
    let plain = version < 4 || u16::from_le_bytes([data[10], data[11]]) & flags::ZSTD == 0;
    let mut last = reader.offset();
    loop {
        match reader.next_record() {
            Ok(Some(rec)) => {
                // Progress is forward and bounded by the input; in a plain body, strictly
                // forward and at most one record's bounded length at a time, but for Sync
                // records (taken in, not handed out) before it.
                assert!(reader.offset() >= last && reader.offset() <= data.len() as u64);
                if plain {
                    assert!(reader.offset() > last);
                    assert!(reader.offset() - last <= MAX_RECORD_LEN + 11 || has_sync(&data[last as usize..]));
                }
                last = reader.offset();
                if let Record::Stack(s) = rec {
                    assert!(s.frames.len() <= gpumemtrace_format::MAX_FRAMES);
                }
            }
            Ok(None) => {
                assert!(!plain || last == data.len() as u64);
                break;
            }
            Err(ReadError::Truncated { offset }) | Err(ReadError::Corrupt { offset, .. }) => {
                // In a plain body, where the next record starts (after any Sync records).
                assert!(if plain { offset == last || (offset > last && has_sync(&data[last as usize..])) } else { offset >= last && offset <= data.len() as u64 });
                break;
            }
            Err(e) => panic!("unexpected error kind on in-memory input: {e}"),
        }
    }
    gpumemtrace_cli::fuzz::summary(data);
});

/// Whether the plain records from the start of `b` begin with a Sync record.
fn has_sync(b: &[u8]) -> bool {
    b.first() == Some(&gpumemtrace_format::tag::SYNC)
}
