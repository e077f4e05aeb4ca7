//! Compressed trace bodies (format version 4, header flag [`flags::ZSTD`](crate::flags::ZSTD)).
//!
//! A training loop repeats itself: the same stacks, sizes and address deltas step after step, so
//! the record stream compresses some tenfold. The body after the header is a series of zstd
//! frames, each flushed at every write: whatever reached the file can be decoded, so a process
//! killed between two writes leaves a trace readable up to the last one, as an uncompressed trace
//! would be. A reader treats the end of the input inside a frame as the end of the file.
//!
//! Each frame carries zstd's checksum of its contents, and ends once it holds [`FRAME_INPUT`]
//! bytes of records (and at the trace's last write): a reader hands out a frame's records only
//! once its checksum matched, so a flipped byte that still decodes (inside literals, say) is found,
//! and the damaged frame's records are left out instead of reported as findings. Only the frame a
//! process was writing when it stopped is handed out unchecked (it has no end yet), as are the
//! frames of writers older than checksums (one frame that never ends).

use std::io::{self, Read};

use zstd::stream::raw::{CParameter, InBuffer, Operation, OutBuffer};

/// Level 1: the writer thread shares the host's cores; higher levels buy little on such data.
const LEVEL: i32 = 1;

/// Record bytes a frame holds before it ends (at the end of the write that reached it). Each
/// frame starts without the previous one's history: against one frame, 1 MiB frames made a
/// PyTorch-like trace 0.14 % larger (256 KiB: 0.5 %) and the summary bench's synthetic trace,
/// whose loop is long, 4 % (256 KiB: 27 %; 4 MiB: 0.9 %). A damaged frame loses at most this much
/// of records (some fifty thousand events) with it, and a reader holds at most one frame back.
pub const FRAME_INPUT: usize = 1 << 20;

/// Compressed bytes given to the decoder at a time.
const INPUT_CHUNK: usize = 4096;

/// Room the decoder gets at a time.
const OUTPUT_CHUNK: usize = 128 * 1024;

/// Decoded bytes of one frame held back until its checksum is checked, at most: a frame larger
/// than any writer makes (or one with no checksum) is handed out as it is decoded, unchecked.
const MAX_HELD: usize = 8 << 20;

/// The writer's side: record bytes in, compressed bytes (everything flushed) out.
pub struct Compressor {
    enc: zstd::stream::raw::Encoder<'static>,
    /// Record bytes in the frame being written.
    in_frame: usize,
    /// Where frames end ([`FRAME_INPUT`]; smaller in tests).
    frame_input: usize,
}

impl Compressor {
    pub fn new() -> io::Result<Compressor> {
        Compressor::with_frames(FRAME_INPUT)
    }

    /// A compressor whose frames end once they hold `frame_input` bytes of records.
    pub fn with_frames(frame_input: usize) -> io::Result<Compressor> {
        let mut enc = zstd::stream::raw::Encoder::new(LEVEL)?;
        enc.set_parameter(CParameter::ChecksumFlag(true))?;
        Ok(Compressor { enc, in_frame: 0, frame_input: frame_input.max(1) })
    }

    /// Compresses `data` and flushes, appending to `out` every byte a reader needs to decode all
    /// data given so far; the frame ends here once it holds enough records.
    pub fn compress(&mut self, data: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        self.compress_ending(data, out, false)
    }

    /// [`Compressor::compress`], ending the frame whatever it holds where `end` (the trace's
    /// last write: then every record of the trace is checked). Writes after it start a new frame.
    pub fn compress_ending(&mut self, data: &[u8], out: &mut Vec<u8>, end: bool) -> io::Result<()> {
        self.compress_parts(&[data], out, end)
    }

    /// Whether the next write starts a frame (the writer puts a Sync record first: see
    /// `EventState::sync`).
    pub fn at_frame_start(&self) -> bool {
        self.in_frame == 0
    }

    /// After a write that did not (wholly) reach the file: the frame it was in is broken there,
    /// so the next write starts a new frame (with its Sync record), which a reader finds past
    /// the broken one. Otherwise every later write of that frame would be lost with it.
    pub fn abandon_frame(&mut self) -> io::Result<()> {
        self.in_frame = 0;
        self.enc.reinit()
    }

    /// [`Compressor::compress_ending`] of the parts one after the other.
    pub fn compress_parts(&mut self, parts: &[&[u8]], out: &mut Vec<u8>, end: bool) -> io::Result<()> {
        for data in parts {
            let mut src = InBuffer::around(data);
            while src.pos() < data.len() {
                self.enc.run(&mut src, &mut room(out))?;
            }
            self.in_frame += data.len();
        }
        let ending = (end && self.in_frame > 0) || self.in_frame >= self.frame_input;
        loop {
            let mut dst = room(out);
            let left = if ending { self.enc.finish(&mut dst, false)? } else { self.enc.flush(&mut dst)? };
            if left == 0 {
                break;
            }
        }
        if ending {
            self.in_frame = 0;
            self.enc.reinit()?;
        }
        Ok(())
    }
}

/// The reader's side: a trace body, plain or compressed.
pub(crate) enum Body<R: Read> {
    Plain(R),
    Zstd(Box<Frames<R>>),
}

/// A reader that counts what was read through it.
pub(crate) struct Counted<R> {
    inner: R,
    count: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

/// `out`'s room for an encoder's or a decoder's output, after what it holds.
fn room(out: &mut Vec<u8>) -> OutBuffer<'_, Vec<u8>> {
    out.reserve(OUTPUT_CHUNK);
    let filled = out.len();
    OutBuffer::around_pos(out, filled)
}

/// A compressed body decoded frame by frame: a frame's bytes are handed out once its checksum
/// matched (see the module's documentation).
pub(crate) struct Frames<R: Read> {
    input: Counted<R>,
    dec: zstd::stream::raw::Decoder<'static>,
    /// Compressed bytes read and not yet decoded: `inbuf[in_pos..in_len]`.
    inbuf: Box<[u8]>,
    in_pos: usize,
    in_len: usize,
    /// Decoded bytes: `out[start..released]` may be handed out; `out[released..]` belong to the
    /// frame being decoded, held until its checksum is checked.
    out: Vec<u8>,
    start: usize,
    released: usize,
    /// The writer's frames carry checksums (seen in the first frame's header, and in the
    /// header of the frame found after a damaged one): else every byte is handed out as it is
    /// decoded, as before checksums.
    checked: Option<bool>,
    /// Where the frame being decoded starts in the file.
    frame_at: u64,
    /// Part of the frame being decoded was handed out unchecked (a frame without checksum, or
    /// one that outgrew `MAX_HELD`).
    partly_out: bool,
    /// Damaged frames left out, each where it started and why; after one, `skipping` until the
    /// next frame's magic number.
    damaged: Vec<(u64, String)>,
    skipping: bool,
    /// How reading ended: the end of the file, or the decoder's refusal (a corrupt frame).
    end: Option<Option<String>>,
}

/// Damaged frames a reader goes on past, at most: a file with more is not a trace any more.
const MAX_DAMAGED: usize = 100;

/// A zstd frame's first four bytes.
const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

impl<R: Read> Body<R> {
    pub(crate) fn zstd(inner: R) -> io::Result<Body<R>> {
        let frames = Frames {
            input: Counted { inner, count: 0 },
            dec: zstd::stream::raw::Decoder::new()?,
            inbuf: vec![0; INPUT_CHUNK].into_boxed_slice(),
            in_pos: 0,
            in_len: 0,
            out: Vec::new(),
            start: 0,
            released: 0,
            checked: None,
            frame_at: crate::HEADER_LEN as u64,
            partly_out: false,
            damaged: Vec::new(),
            skipping: false,
            end: None,
        };
        Ok(Body::Zstd(Box::new(frames)))
    }

    /// The damaged frames left out so far (see `Reader::damaged`).
    pub(crate) fn damaged(&self) -> &[(u64, String)] {
        match self {
            Body::Plain(_) => &[],
            Body::Zstd(f) => &f.damaged,
        }
    }

    /// For a compressed body, the body bytes read from the file so far (records have no byte
    /// position of their own in the file); `None` for a plain one.
    pub(crate) fn consumed(&self) -> Option<u64> {
        match self {
            Body::Plain(_) => None,
            Body::Zstd(f) => Some(f.input.count),
        }
    }
}

impl<R: Read> Frames<R> {
    /// Reads compressed bytes (at least a frame header's first five at the start of the body,
    /// where the file has them) and decodes them; sets `end` at the end of the file or at bytes
    /// the decoder refuses. Errors are the file's own.
    fn decode_more(&mut self) -> io::Result<()> {
        if self.start == self.released && self.start > 0 {
            self.out.drain(..self.start);
            self.released -= self.start;
            self.start = 0;
        }
        if self.in_pos == self.in_len {
            let (want, mut n) = (if self.checked.is_none() { 5 } else { 1 }, 0);
            while n < want {
                match self.input.read(&mut self.inbuf[n..]) {
                    Ok(0) => break,
                    Ok(got) => n += got,
                    // Read again: what this loop already read must not be lost.
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if self.checked.is_none() {
                // Frame header: magic (4 bytes), then its descriptor, whose bit 2 is the
                // checksum flag.
                self.checked = Some(n >= 5 && self.inbuf[..4] == MAGIC && self.inbuf[4] & 4 != 0);
            }
            if n == 0 {
                // The end of the file inside a frame is the end of the trace (the frame a
                // process was writing when it stopped): what it decoded to stands, unchecked,
                // with whatever the decoder still holds of a block it decoded.
                loop {
                    let filled = self.out.len();
                    let ran = self.dec.run(&mut InBuffer::around(&[]), &mut room(&mut self.out));
                    if ran.is_err() || self.out.len() == filled {
                        break;
                    }
                }
                self.released = self.out.len();
                self.end = Some(None);
                return Ok(());
            }
            (self.in_pos, self.in_len) = (0, n);
        }
        if self.skipping {
            return self.skip_to_frame();
        }
        let mut src = InBuffer::around(&self.inbuf[self.in_pos..self.in_len]);
        let run = self.dec.run(&mut src, &mut room(&mut self.out));
        self.in_pos += src.pos();
        match run {
            Ok(0) => {
                // A frame ended and its checksum (if it has one) matched.
                self.released = self.out.len();
                self.frame_at = self.at_in_pos();
                self.partly_out = false;
                self.dec.reinit()?;
            }
            Ok(_) => {
                if self.checked != Some(true) || self.out.len() - self.released > MAX_HELD {
                    self.partly_out |= self.out.len() > self.released;
                    self.released = self.out.len();
                }
            }
            Err(e) => {
                // The damaged frame's bytes are left out: what decoded before the refused byte
                // may be wrong too (a checksum fails only at the frame's end). (The decoder
                // already dropped what it decoded in this call.)
                self.out.truncate(self.released);
                // Unless part of this frame was handed out unchecked (a frame without checksum,
                // as old writers' one frame, once it decoded anything; or one past `MAX_HELD`):
                // then the record layer may stand inside a record, and reading ends here.
                if !self.partly_out && self.damaged.len() < MAX_DAMAGED {
                    // Frames are independent, end at a record boundary and start with a Sync
                    // record (the event deltas): reading goes on at the next frame.
                    self.damaged.push((self.frame_at, format!("compressed body: {e}")));
                    self.dec.reinit()?;
                    self.skipping = true;
                    // Not the damaged frame's own magic number again.
                    if self.at_in_pos() == self.frame_at {
                        self.in_pos += 1;
                    }
                } else {
                    self.end = Some(Some(format!("compressed body: {e}")));
                }
            }
        }
        Ok(())
    }

    /// Where `inbuf[in_pos]` lies in the file.
    fn at_in_pos(&self) -> u64 {
        self.input.count - (self.in_len - self.in_pos) as u64 + crate::HEADER_LEN as u64
    }

    /// After a damaged frame: drops input up to the next frame's magic number (then decoding
    /// goes on from it) or to the end of the file.
    fn skip_to_frame(&mut self) -> io::Result<()> {
        loop {
            let hay = &self.inbuf[self.in_pos..self.in_len];
            if let Some(i) = hay.windows(4).position(|w| w == MAGIC) {
                // Frames of one writer are alike: this one says whether they carry checksums.
                if let Some(&desc) = hay.get(i + 4) {
                    self.checked = Some(desc & 4 != 0);
                }
                self.in_pos += i;
                self.frame_at = self.at_in_pos();
                self.skipping = false;
                return Ok(());
            }
            // The last three bytes may begin a magic number the next read completes.
            let keep = hay.len().min(3);
            self.inbuf.copy_within(self.in_len - keep..self.in_len, 0);
            (self.in_pos, self.in_len) = (0, keep);
            let got = self.input.read(&mut self.inbuf[keep..])?;
            if got == 0 {
                self.released = self.out.len();
                self.end = Some(None);
                return Ok(());
            }
            self.in_len += got;
        }
    }
}

impl<R: Read> Read for Body<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let f = match self {
            Body::Plain(r) => return r.read(buf),
            Body::Zstd(f) => f,
        };
        loop {
            if f.start < f.released {
                let n = buf.len().min(f.released - f.start);
                buf[..n].copy_from_slice(&f.out[f.start..f.start + n]);
                f.start += n;
                return Ok(n);
            }
            match &f.end {
                Some(None) => return Ok(0),
                // Not the file failing but the decoder refusing its bytes: corrupt data, which
                // the record layer reports with the offset (the records before it stand).
                Some(Some(why)) => return Err(io::Error::new(io::ErrorKind::InvalidData, why.clone())),
                None => {}
            }
            // The file's own errors pass as they are.
            f.decode_more()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FRAME_INPUT;
    use crate::*;

    fn events(n: u64) -> Vec<Record> {
        (0..n)
            .map(|i| Record::Event(Event { api: 3, time_ns: 1000 + i * 7, tid: 9, addr: 0x7f00_0000 + (i % 4) * 4096, size: 4096, ..Event::default() }))
            .collect()
    }

    /// How a test's trace is compressed.
    #[derive(Clone, Copy)]
    enum Writer {
        /// Today's writer, frames ending at the given size (and the last write ending its frame).
        Frames(usize),
        /// Today's writer as a process stops mid-run: the last frame has no end.
        Unended,
        /// Writers before checksums: one frame without a checksum, flushed, never ended.
        Old,
    }

    /// A compressed trace written in `flushes` pieces, and the byte length after each piece.
    fn written(recs: &[Record], flushes: usize) -> (Vec<u8>, Vec<usize>) {
        written_by(Writer::Unended, recs, flushes)
    }

    fn written_by(how: Writer, recs: &[Record], flushes: usize) -> (Vec<u8>, Vec<usize>) {
        let mut file = header_with(flags::ZSTD).to_vec();
        let mut enc = Encoder::new();
        let mut c = Compressor::with_frames(match how {
            Writer::Frames(n) => n,
            _ => FRAME_INPUT,
        })
        .unwrap();
        let mut old = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        let mut ends = Vec::new();
        let parts: Vec<&[Record]> = recs.chunks(recs.len().div_ceil(flushes)).collect();
        for (i, part) in parts.iter().enumerate() {
            let mut buf = Vec::new();
            // As the tracer's sink: a frame starts with where the event deltas stand.
            if matches!(how, Writer::Frames(_) | Writer::Unended) && c.at_frame_start() {
                enc.event_state().sync(&mut buf);
            }
            for r in part.iter() {
                enc.encode(r, &mut buf);
            }
            match how {
                Writer::Old => {
                    use std::io::Write;
                    old.write_all(&buf).unwrap();
                    old.flush().unwrap();
                    file.extend_from_slice(old.get_ref());
                    old.get_mut().clear();
                }
                Writer::Frames(_) => c.compress_ending(&buf, &mut file, i + 1 == parts.len()).unwrap(),
                Writer::Unended => c.compress(&buf, &mut file).unwrap(),
            }
            ends.push(file.len());
        }
        (file, ends)
    }

    fn read(bytes: &[u8]) -> (Vec<Record>, Option<ReadError>) {
        let (out, err, damaged) = read_past_damage(bytes);
        assert!(damaged.is_empty(), "{damaged:?}");
        (out, err)
    }

    /// The records, how reading ended, and the damaged frames left out.
    fn read_past_damage(bytes: &[u8]) -> (Vec<Record>, Option<ReadError>, Vec<(u64, String)>) {
        let mut r = Reader::new(bytes).unwrap();
        let mut out = Vec::new();
        loop {
            match r.next_record() {
                Ok(Some(rec)) => out.push(rec),
                Ok(None) => return (out, None, r.damaged().to_vec()),
                Err(e) => return (out, Some(e), r.damaged().to_vec()),
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

    /// Records that compress poorly: each write is several of the decoder's input pieces.
    fn random_events(n: u64) -> Vec<Record> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                Record::Event(Event { api: 3, time_ns: 1000 + i, tid: 9, addr: x, size: x >> 40, ..Event::default() })
            })
            .collect()
    }

    #[test]
    fn a_flipped_byte_in_a_finished_frame_is_found_and_only_that_frames_records_are_left_out() {
        // Four frames of 1000 events each, the last ended by the last write.
        let recs = random_events(4000);
        let (file, ends) = written_by(Writer::Frames(1), &recs, 4);
        let (back, err) = read(&file);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(back, recs);
        let (mut tried, mut found, mut literal, mut one_frame) = (0, 0, 0, 0);
        for pos in (crate::HEADER_LEN..file.len()).step_by(23) {
            tried += 1;
            let mut bad = file.clone();
            bad[pos] ^= 0xff;
            let (back, err, damaged) = read_past_damage(&bad);
            assert!(err.is_none(), "flip at {pos}: {err:?}");
            if damaged.is_empty() {
                // A bit no decoder reads (a header's unused bit): the records are the same.
                assert_eq!(back, recs, "flip at {pos} went unnoticed");
                continue;
            }
            found += 1;
            literal += usize::from(damaged[0].1.contains("checksum"));
            // The frame holding the byte: every frame before it is read whole, not one record
            // of it, and reading goes on with the frames after it (all of them, unless the
            // damage hid the next one's start), each record exactly as written.
            let frame = ends.iter().filter(|&&e| e <= pos).count();
            let start = if frame == 0 { crate::HEADER_LEN } else { ends[frame - 1] };
            assert_eq!(damaged[0].0, start as u64, "flip at {pos}: {damaged:?}");
            assert!(back.len() <= recs.len() - 1000 && back.len() % 1000 == 0, "flip at {pos}: {} records", back.len());
            assert_eq!(back[..frame * 1000], recs[..frame * 1000], "flip at {pos}");
            let after = back.len() - frame * 1000;
            assert_eq!(back[frame * 1000..], recs[recs.len() - after..], "flip at {pos}");
            one_frame += usize::from(back.len() == recs.len() - 1000);
        }
        // Almost every flip is found (2359 of 2359 when written), most of them only by the
        // checksum: they decode without complaint (inside literals, say); and almost always
        // only the damaged frame is lost.
        assert!(found * 100 >= tried * 95, "{found} of {tried} flips found");
        assert!(literal * 2 > tried, "{literal} of {tried} found by the checksum");
        assert!(one_frame * 100 >= found * 95, "{one_frame} of {found} lost one frame only");
    }

    #[test]
    fn after_a_write_that_never_reached_the_file_the_next_frame_reads_whole() {
        // Three writes of 1000 events into one frame; the second never reaches the file (a full
        // disk, say), and the writer abandons its frame: the third starts a new one.
        let recs = random_events(3000);
        let mut file = header_with(flags::ZSTD).to_vec();
        let (mut enc, mut c) = (Encoder::new(), Compressor::new().unwrap());
        for (i, part) in recs.chunks(1000).enumerate() {
            let mut buf = Vec::new();
            if c.at_frame_start() {
                enc.event_state().sync(&mut buf);
            }
            part.iter().for_each(|r| enc.encode(r, &mut buf));
            let mut out = Vec::new();
            c.compress_ending(&buf, &mut out, i == 2).unwrap();
            if i == 1 {
                c.abandon_frame().unwrap();
            } else {
                file.extend_from_slice(&out);
            }
        }
        // The broken frame (the first write and the lost one) is left out; the third write's
        // records read exactly as written.
        let (back, err, damaged) = read_past_damage(&file);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(back, recs[2000..]);
    }

    #[test]
    fn a_finished_trace_is_checked_whole_and_its_size_barely_grows() {
        let recs = events(100_000);
        let (framed, _) = written_by(Writer::Frames(256 * 1024), &recs, 100);
        let (old, _) = written_by(Writer::Old, &recs, 100);
        let (back, err) = read(&framed);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(back, recs);
        // Frames with checksums against one frame without: 2 % more, and each frame's header,
        // checksum and first block (the loop compresses to almost nothing).
        let mut raw = Vec::new();
        let mut enc = Encoder::new();
        recs.iter().for_each(|r| enc.encode(r, &mut raw));
        let frames = raw.len().div_ceil(256 * 1024);
        assert!(frames > 2, "{} bytes of records", raw.len());
        assert!(framed.len() <= old.len() * 102 / 100 + 64 * frames, "{} against {} bytes, {frames} frames", framed.len(), old.len());
        // The last byte of the file is the last frame's checksum: that frame is left out.
        let mut bad = framed.clone();
        *bad.last_mut().unwrap() ^= 1;
        let (back, err, damaged) = read_past_damage(&bad);
        assert!(err.is_none(), "{err:?}");
        assert!(damaged.len() == 1 && damaged[0].1.contains("checksum"), "{damaged:?}");
        assert!(back.len() < recs.len() && back[..] == recs[..back.len()]);
    }

    #[test]
    fn traces_of_writers_before_checksums_read_as_they_did() {
        // Bytes the decoder refuses are corrupt at an offset, and what came before stands.
        let recs = random_events(3000);
        let (file, ends) = written_by(Writer::Old, &recs, 3);
        let (back, err) = read(&file);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(back, recs);
        assert!(ends[0] - crate::HEADER_LEN > 2 * super::INPUT_CHUNK, "{ends:?}");
        let mut refused = 0;
        // Bytes of the last two writes flipped in turn. (A flipped literal decodes to other
        // bytes without complaint: such a stream carries no checksum, so only the count of
        // records read is checked.)
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
        for how in [Writer::Unended, Writer::Frames(1), Writer::Frames(40_000), Writer::Old] {
            let (file, ends) = written_by(how, &recs, 3);
            for cut in (crate::HEADER_LEN..=file.len()).step_by(7).chain(ends.iter().copied()) {
                let (back, _) = read(&file[..cut]);
                // Nothing is made up, and what a finished write held is all there (a frame cut
                // short is the one a process was writing when it stopped: read unchecked).
                assert_eq!(back[..], recs[..back.len()], "cut at {cut}");
                let whole_writes = ends.iter().filter(|&&e| e <= cut).count();
                assert!(back.len() >= whole_writes * 1000, "cut at {cut}: {} records", back.len());
            }
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
    fn garbage_after_a_compressed_header_is_damage_not_a_panic() {
        let mut file = header_with(flags::ZSTD).to_vec();
        file.extend_from_slice(b"this is not zstd at all, not at all");
        let (back, err, damaged) = read_past_damage(&file);
        assert!(back.is_empty() && err.is_none());
        assert_eq!(damaged.len(), 1, "{damaged:?}");
        assert_eq!(damaged[0].0, crate::HEADER_LEN as u64);
    }

    #[test]
    fn unknown_header_flags_are_refused() {
        assert!(matches!(Reader::new(&header_with(0x80)[..]), Err(ReadError::BadHeader(_))));
    }
}
