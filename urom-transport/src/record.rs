//! Records with an integrity check: how an authenticated byte stream (the control connection
//! of a host on another machine, a worker's front door) carries what follows the
//! authentication.
//!
//! Each `write` becomes one record: its length (`u32`, little-endian), the bytes, and an
//! HMAC-SHA256 tag over a per-direction record counter, the length and the bytes, under a key
//! of that direction that both sides derived from the session (see
//! [`SessionKeys`](crate::auth::SessionKeys)). The reader hands out a record's bytes only
//! after its tag checked, so a byte changed, dropped, replayed, reordered or reflected on the
//! way fails the stream with [`io::ErrorKind::InvalidData`] instead of being acted on. Records
//! are not encrypted: control messages carry nothing secret (worker keys travel sealed).

use std::io::{self, Read};
use std::ops::Range;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a record's length field.
const LEN_LEN: usize = 4;
/// Bytes of a record's tag.
pub const TAG_LEN: usize = 32;

/// A key for the records of one direction of one session. Never printed.
#[derive(Clone)]
pub struct RecordKey(pub(crate) [u8; 32]);

impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(..)")
    }
}

/// Tags records in order: the counter makes each tag good for one place in the stream only.
struct Tagger {
    mac: Hmac<Sha256>,
    counter: u64,
}

impl Tagger {
    fn new(key: &RecordKey) -> Self {
        Self {
            mac: <Hmac<Sha256> as Mac>::new_from_slice(&key.0).expect("HMAC takes any key length"),
            counter: 0,
        }
    }

    /// The MAC of the next record, whose length field and bytes are `record`.
    fn next(&mut self, record: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.mac.clone();
        mac.update(&self.counter.to_le_bytes());
        mac.update(record);
        self.counter += 1;
        mac
    }
}

/// The writing side: makes one record of each payload.
pub struct Sealer {
    tagger: Tagger,
    max: usize,
    buf: Vec<u8>,
}

impl Sealer {
    /// Records of at most `max` bytes each.
    pub fn new(key: &RecordKey, max: usize) -> Self {
        Self {
            tagger: Tagger::new(key),
            max,
            buf: Vec::with_capacity(LEN_LEN + max + TAG_LEN),
        }
    }

    /// The record of the first `n` bytes of `payload` (at most the maximum), to be written
    /// whole; returns `n` and the record.
    pub fn seal<'a>(&'a mut self, payload: &[u8]) -> (usize, &'a [u8]) {
        let n = payload.len().min(self.max);
        self.buf.clear();
        // `n` is at most the maximum, which a u32 holds (a maximum message size).
        self.buf.extend_from_slice(&(n as u32).to_le_bytes());
        self.buf.extend_from_slice(&payload[..n]);
        let tag = self.tagger.next(&self.buf).finalize().into_bytes();
        self.buf.extend_from_slice(&tag);
        (n, &self.buf)
    }
}

/// The reading side: collects a record, checks its tag, then hands its bytes out. Works on a
/// non-blocking stream too: a read that would block keeps what was collected.
pub struct Opener {
    tagger: Tagger,
    max: usize,
    buf: Vec<u8>,
    /// Bytes of the record being collected.
    have: usize,
    /// What of a checked record is left to hand out.
    ready: Range<usize>,
}

impl Opener {
    /// Records of at most `max` bytes each.
    pub fn new(key: &RecordKey, max: usize) -> Self {
        Self {
            tagger: Tagger::new(key),
            max,
            buf: vec![0; LEN_LEN + max + TAG_LEN],
            have: 0,
            ready: 0..0,
        }
    }

    /// Reads from `inner` until a record checked, then hands out its bytes, as `Read::read`
    /// does. A read that fails (a timeout) keeps what was collected for the next call.
    pub fn read(&mut self, inner: &mut impl Read, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.ready.is_empty() {
                let n = out.len().min(self.ready.len());
                out[..n].copy_from_slice(&self.buf[self.ready.start..self.ready.start + n]);
                self.ready.start += n;
                return Ok(n);
            }
            let need = self.need()?;
            if self.have == need {
                self.check(need)?;
                continue;
            }
            match inner.read(&mut self.buf[self.have..need])? {
                0 if self.have == 0 => return Ok(0),
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream ended halfway through a record",
                    ));
                }
                n => self.have += n,
            }
        }
    }

    /// Whether part of a record has arrived and waits for the rest (a caller driving the
    /// stream without blocking bounds how long that may take).
    pub fn holds_partial_record(&self) -> bool {
        self.have > 0
    }

    /// How many bytes the record being collected has in all (only its length field, until
    /// that arrived).
    fn need(&self) -> io::Result<usize> {
        if self.have < LEN_LEN {
            return Ok(LEN_LEN);
        }
        let len = u32::from_le_bytes(self.buf[..LEN_LEN].try_into().expect("four bytes")) as usize;
        if len > self.max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a record of {len} bytes, more than the {} allowed",
                    self.max
                ),
            ));
        }
        Ok(LEN_LEN + len + TAG_LEN)
    }

    /// Checks the whole record of `len` bytes collected; its payload becomes ready.
    fn check(&mut self, len: usize) -> io::Result<()> {
        let body = len - TAG_LEN;
        let tag = &self.buf[body..len];
        if self
            .tagger
            .next(&self.buf[..body])
            .verify_slice(tag)
            .is_err()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a record failed its integrity check: it was changed, replayed or reordered on \
                 the way, or the peer holds other keys",
            ));
        }
        self.have = 0;
        self.ready = LEN_LEN..body;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> RecordKey {
        RecordKey([byte; 32])
    }

    fn records(payloads: &[&[u8]], key: &RecordKey) -> Vec<u8> {
        let mut sealer = Sealer::new(key, 64);
        let mut out = Vec::new();
        for payload in payloads {
            let (n, record) = sealer.seal(payload);
            assert_eq!(n, payload.len());
            out.extend_from_slice(record);
        }
        out
    }

    fn read_all(bytes: &[u8], key: &RecordKey) -> io::Result<Vec<u8>> {
        let mut opener = Opener::new(key, 64);
        let mut inner = bytes;
        let mut got = Vec::new();
        let mut chunk = [0; 7];
        loop {
            match opener.read(&mut inner, &mut chunk)? {
                0 => return Ok(got),
                n => got.extend_from_slice(&chunk[..n]),
            }
        }
    }

    #[test]
    fn records_read_back_in_order_in_any_chunk_size() {
        let bytes = records(&[b"hello", b"", b"world, and more"], &key(1));
        assert_eq!(read_all(&bytes, &key(1)).unwrap(), b"helloworld, and more");
    }

    #[test]
    fn a_changed_reordered_or_foreign_record_is_refused() {
        let bytes = records(&[b"spawn", b"destroy"], &key(1));
        for at in 0..bytes.len() {
            let mut changed = bytes.clone();
            changed[at] ^= 0x20;
            assert!(read_all(&changed, &key(1)).is_err(), "flipped byte {at}");
        }
        let first = records(&[b"spawn"], &key(1));
        let (one, two) = bytes.split_at(first.len());
        let swapped = [two, one].concat();
        let error = read_all(&swapped, &key(1)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        let replayed = [one, one].concat();
        assert!(read_all(&replayed, &key(1)).is_err(), "a replayed record");
        assert!(read_all(&bytes, &key(2)).is_err(), "another key");
        let truncated = &bytes[..bytes.len() - 1];
        let error = read_all(truncated, &key(1)).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_record_longer_than_the_maximum_is_refused_before_it_is_read() {
        let mut bytes = 65u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0; 100]);
        let error = read_all(&bytes, &key(1)).unwrap_err();
        assert!(error.to_string().contains("more than the 64"), "{error}");
    }
}
