//! Arbitrary bytes into the trace reader: it must return records or an error with an offset,
//! never panic, never loop, never allocate more than a record's bounded length.
#![no_main]

use gpumemtrace_format::{ReadError, Reader, Record, MAX_RECORD_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut reader) = Reader::new(data) else { return };
    let mut last = reader.offset();
    loop {
        match reader.next_record() {
            Ok(Some(rec)) => {
                // Progress is strictly forward and bounded by the input.
                assert!(reader.offset() > last && reader.offset() <= data.len() as u64);
                assert!(reader.offset() - last <= MAX_RECORD_LEN + 11);
                last = reader.offset();
                if let Record::Stack(s) = rec {
                    assert!(s.frames.len() <= gpumemtrace_format::MAX_FRAMES);
                }
            }
            Ok(None) => {
                assert_eq!(last, data.len() as u64);
                break;
            }
            Err(ReadError::Truncated { offset }) | Err(ReadError::Corrupt { offset, .. }) => {
                assert_eq!(offset, last);
                break;
            }
            Err(e) => panic!("unexpected error kind on in-memory input: {e}"),
        }
    }
});
