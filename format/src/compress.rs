//! Compressed trace bodies (format version 4, header flag [`flags::ZSTD`](crate::flags::ZSTD)).
//!
//! A training loop repeats itself: the same stacks, sizes and address deltas step after step, so
//! the record stream compresses some tenfold. The body after the header is then one zstd stream,
//! flushed (not ended) at every write: whatever reached the file can be decoded, so a process
//! killed between two writes leaves a trace readable up to the last one, as an uncompressed trace
//! would be. A reader treats the stream's end inside a zstd frame as the end of the file.

use std::cell::Cell;
use std::rc::Rc;
use std::io::{self, Read, Write};

/// Level 1: the writer thread shares the host's cores; higher levels buy little on such data.
const LEVEL: i32 = 1;

/// Compressed bytes given to the decoder at a time. What it decoded from one such piece is lost
/// when it refuses a byte of it (a corrupt trace): smaller pieces keep more of what came before
/// the corruption, at a few more calls (zstd's own default is 128 KiB).
const INPUT_CHUNK: usize = 4096;

/// The writer's side: record bytes in, compressed bytes (everything flushed) out.
pub struct Compressor {
    enc: zstd::stream::write::Encoder<'static, Vec<u8>>,
}

impl Compressor {
    pub fn new() -> io::Result<Compressor> {
        Ok(Compressor { enc: zstd::stream::write::Encoder::new(Vec::new(), LEVEL)? })
    }

    /// Compresses `data` and flushes, appending to `out` every byte a reader needs to decode all
    /// data given so far.
    pub fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        self.enc.write_all(data)?;
        self.enc.flush()?;
        let done = self.enc.get_mut();
        out.extend_from_slice(done);
        done.clear();
        Ok(())
    }
}

/// The reader's side: a trace body, plain or compressed.
pub(crate) enum Body<R: Read> {
    Plain(R),
    /// With what the decoder has read through `Counted`.
    Zstd(Box<zstd::stream::read::Decoder<'static, io::BufReader<Counted<R>>>>, Rc<Intake>),
}

/// What was read from the file under a decoder: how many bytes, and whether reading failed.
#[derive(Default)]
pub(crate) struct Intake {
    count: Cell<u64>,
    failed: Cell<bool>,
}

/// A reader that counts what was read through it.
pub(crate) struct Counted<R> {
    inner: R,
    read: Rc<Intake>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf).inspect_err(|_| self.read.failed.set(true))?;
        self.read.count.set(self.read.count.get() + n as u64);
        Ok(n)
    }
}

impl<R: Read> Body<R> {
    pub(crate) fn zstd(inner: R) -> io::Result<Body<R>> {
        let read = Rc::new(Intake::default());
        let counted = Counted { inner, read: read.clone() };
        let input = io::BufReader::with_capacity(INPUT_CHUNK, counted);
        Ok(Body::Zstd(Box::new(zstd::stream::read::Decoder::with_buffer(input)?), read))
    }

    /// For a compressed body, the body bytes read from the file so far (records have no byte
    /// position of their own in the file); `None` for a plain one.
    pub(crate) fn consumed(&self) -> Option<u64> {
        match self {
            Body::Plain(_) => None,
            Body::Zstd(_, read) => Some(read.count.get()),
        }
    }
}

impl<R: Read> Read for Body<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Body::Plain(r) => r.read(buf),
            Body::Zstd(d, read) => match d.read(buf) {
                // The writer never ends its frame (it only flushes), and a killed process stops
                // anywhere: the end of the input inside a frame is the end of the trace. A cut
                // inside a record is still told apart by the record layer.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(0),
                // Not the file failing but the decoder refusing its bytes: corrupt data, which
                // the record layer reports with the offset (the records before it stand).
                Err(e) if !read.failed.get() => Err(io::Error::new(io::ErrorKind::InvalidData, format!("compressed body: {e}"))),
                r => r,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::*;

    fn events(n: u64) -> Vec<Record> {
        (0..n)
            .map(|i| Record::Event(Event { api: 3, time_ns: 1000 + i * 7, tid: 9, addr: 0x7f00_0000 + (i % 4) * 4096, size: 4096, ..Event::default() }))
            .collect()
    }

    /// A compressed trace written in `flushes` pieces, and the byte length after each piece.
    fn written(recs: &[Record], flushes: usize) -> (Vec<u8>, Vec<usize>) {
        let mut file = header_with(flags::ZSTD).to_vec();
        let (mut enc, mut c) = (Encoder::new(), Compressor::new().unwrap());
        let mut ends = Vec::new();
        for part in recs.chunks(recs.len().div_ceil(flushes)) {
            let mut buf = Vec::new();
            for r in part {
                enc.encode(r, &mut buf);
            }
            c.compress(&buf, &mut file).unwrap();
            ends.push(file.len());
        }
        (file, ends)
    }

    fn read(bytes: &[u8]) -> (Vec<Record>, Option<ReadError>) {
        let mut r = Reader::new(bytes).unwrap();
        let mut out = Vec::new();
        loop {
            match r.next_record() {
                Ok(Some(rec)) => out.push(rec),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    #[test]
    fn a_repeating_loop_compresses_to_a_few_bytes_an_event_and_reads_back_whole() {
        let recs = events(100_000);
        let (file, _) = written(&recs, 100);
        assert!(file.len() < 4 * recs.len(), "{} bytes for {} events", file.len(), recs.len());
        let (back, err) = read(&file);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(back, recs);
    }

    #[test]
    fn bytes_the_decompressor_refuses_are_corrupt_at_an_offset_and_what_came_before_stands() {
        // Addresses and sizes that compress poorly: each write is several of the decoder's
        // input pieces.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let recs: Vec<Record> = (0..3000)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                Record::Event(Event { api: 3, time_ns: 1000 + i, tid: 9, addr: x, size: x >> 40, ..Event::default() })
            })
            .collect();
        let (file, ends) = written(&recs, 3);
        assert!(ends[0] - crate::HEADER_LEN > 2 * super::INPUT_CHUNK, "{ends:?}");
        let mut refused = 0;
        // Bytes of the last two writes flipped in turn. (A flipped literal decodes to other
        // bytes without complaint: the stream carries no checksum, so only the count of records
        // read is checked.)
        for pos in (ends[0]..file.len()).step_by(41) {
            let mut bad = file.clone();
            bad[pos] ^= 0xff;
            let (back, err) = read(&bad);
            match err {
                Some(ReadError::Corrupt { offset, what }) => {
                    // Refused by the decoder, or decoded to bytes the record layer refuses.
                    refused += usize::from(what.contains("compressed body"));
                    assert!(offset as usize <= file.len() && offset as usize > ends[0], "flip at {pos}: offset {offset}");
                    // Every write that ended before the decoder's input piece holding the bad
                    // byte is whole (what it decoded from that piece is lost with it).
                    let piece = crate::HEADER_LEN + (pos - crate::HEADER_LEN) / super::INPUT_CHUNK * super::INPUT_CHUNK;
                    let whole = ends.iter().filter(|&&e| e <= piece).count();
                    assert!(back.len() >= whole * 1000, "flip at {pos}: {} records", back.len());
                }
                Some(e @ ReadError::Io(_)) => panic!("flip at {pos}: an I/O error for corrupt data: {e}"),
                _ => {}
            }
        }
        assert!(refused > 0);
    }

    #[test]
    fn a_trace_cut_anywhere_gives_every_record_written_before_the_last_complete_write() {
        let recs = events(3000);
        let (file, ends) = written(&recs, 3);
        for cut in (crate::HEADER_LEN..=file.len()).step_by(7).chain(ends.iter().copied()) {
            let (back, _) = read(&file[..cut]);
            // Nothing is made up, and what a finished write held is all there.
            assert_eq!(back[..], recs[..back.len()], "cut at {cut}");
            let whole_writes = ends.iter().filter(|&&e| e <= cut).count();
            assert!(back.len() >= whole_writes * 1000, "cut at {cut}: {} records", back.len());
        }
    }

    #[test]
    fn where_a_cut_compressed_trace_stops_is_a_byte_of_the_file() {
        // The records decompress to far more bytes than the file holds: a position in them
        // would name a byte past the end of the file.
        // Stacks of random-looking addresses: zstd stores such blocks raw, and a raw block cut
        // short decodes up to the cut, so the stream ends inside a record.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let recs: Vec<Record> = (0..400)
            .map(|id| {
                let frames = (0..64)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    })
                    .collect();
                Record::Stack(crate::Stack { id, frames })
            })
            .chain(events(3000))
            .collect();
        let (file, _) = written(&recs, 3);
        let mut truncated = 0;
        for cut in (crate::HEADER_LEN..file.len()).step_by(97) {
            if let (_, Some(ReadError::Truncated { offset } | ReadError::Corrupt { offset, .. })) = read(&file[..cut]) {
                assert!(offset <= cut as u64, "cut at {cut}: stopped at {offset}");
                truncated += 1;
            }
        }
        assert!(truncated > 0, "some cut ends inside a record");
    }

    #[test]
    fn garbage_after_a_compressed_header_is_an_error_not_a_panic() {
        let mut file = header_with(flags::ZSTD).to_vec();
        file.extend_from_slice(b"this is not zstd at all, not at all");
        let (back, err) = read(&file);
        assert!(back.is_empty());
        assert!(err.is_some());
    }

    #[test]
    fn unknown_header_flags_are_refused() {
        assert!(matches!(Reader::new(&header_with(0x80)[..]), Err(ReadError::BadHeader(_))));
    }
}
