//! The file header (magic, version, flags) and the format's limits and record tags.

/// First 8 bytes of every trace.
pub const MAGIC: &[u8; 8] = b"GPUMTRC\0";
/// Format version written after the magic (u16 little endian), then the header flags (u16).
/// Version 2 stores an event's thread and address as deltas from the previous event's; version 3
/// adds the `block` memory kind (PyTorch's caching-allocator blocks), event flags and the
/// allocator's own totals; version 4 gives the last two header bytes a meaning ([`flags`]): the
/// records are those of version 3. Readers still read versions 1 to 3.
pub const VERSION: u16 = 4;

/// Header flags (version 4; earlier versions wrote zeros there).
pub mod flags {
    /// The body after the header is one zstd stream of records (see `compress.rs`).
    pub const ZSTD: u16 = 1;
}
/// The oldest version this reader understands.
pub const MIN_VERSION: u16 = 1;
/// Size of the file header: magic, version, flags.
pub const HEADER_LEN: usize = 12;
/// No record payload may be longer than this; a longer length means a corrupt file.
pub const MAX_RECORD_LEN: u64 = 1 << 20;
/// No stack may have more frames than this.
pub const MAX_FRAMES: usize = 1024;

/// Record tags.
pub mod tag {
    pub const PROCESS: u8 = 0x01;
    pub const API: u8 = 0x02;
    pub const MODULE: u8 = 0x03;
    pub const STACK: u8 = 0x04;
    pub const EVENT: u8 = 0x05;
    pub const NOTICE: u8 = 0x06;
    pub const STATS: u8 = 0x07;
    pub const PY_CODE: u8 = 0x08;
    pub const PY_STACK: u8 = 0x09;
    pub const PHASE: u8 = 0x0A;
    pub const THREAD: u8 = 0x0B;
    pub const AGG_START: u8 = 0x0C;
    pub const AGG_SITE: u8 = 0x0D;
    pub const AGG_PEAK: u8 = 0x0E;
    pub const AGG_END: u8 = 0x0F;
    pub const AGG_PHASE: u8 = 0x10;
    pub const AGG_FAILURE: u8 = 0x11;
    /// Where the event deltas stand (format-level: never handed to callers as a record).
    pub const SYNC: u8 = 0x12;
}

/// The file header of an uncompressed trace.
pub fn header() -> [u8; HEADER_LEN] {
    header_with(0)
}

/// The file header with `flags` ([`flags`]).
pub fn header_with(flags: u16) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h[10..12].copy_from_slice(&flags.to_le_bytes());
    h
}
