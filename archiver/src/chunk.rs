//! The columnar compressed chunk: consecutive rows of ONE event stream (each row a timestamp, a
//! fixed number of doubles and a fixed number of strings), in the spirit of Facebook's Gorilla
//! (Pelkonen et al., VLDB 2015), tuned for nanosecond timestamps with jitter and for decimal
//! gauges.
//!
//! # Format (version byte `0xC1`)
//!
//! ```text
//! header   u8 0xC1 | varint rows | varint n_doubles | varint n_strings
//!          | first_ts (i64, 8 bytes little-endian)
//!          | zigzag varint last_ts - first_ts | ... min_ts - first_ts | ... max_ts - first_ts
//!          | varint byte length of each column: timestamps, doubles..., strings...
//! columns  each column's bytes, in that order, back to back (offsets = running sum of the
//!          lengths), so a reader decodes the timestamps and ONE column without the others.
//! ```
//!
//! Differences are wrapping `i64` arithmetic, varints LEB128, `zigzag(v) = (v << 1) ^ (v >> 63)`.
//! A chunk of 0 rows has empty columns. Bit streams are written most significant bit first and
//! padded with 0 bits to a byte.
//!
//! ## Bucket codes
//!
//! Integers are coded as their zigzag `z` in the first bucket whose payload width holds it:
//! `0` is z = 0, `10` + w1 bits, `110` + w2 bits, `1110` + w3 bits, ... A column's code starts
//! with a table bit: `0` = the default widths below, `1` = 6 bits (width − 1) for each bucket but
//! the last, whose width is fixed. The writer picks, when it encodes, the widths that make the
//! column shortest for the values it holds (an exact dynamic program over the histogram of the
//! values' bit lengths, kept while rows are pushed) and uses them when that beats the default by
//! more than the table's bits. So the buckets follow each chunk's own jitter.
//!
//! **Timestamps** (nanoseconds): the first one is `first_ts` of the header. With 2 rows or more:
//! the table bit (and widths), the first delta `t[1] - t[0]` as zigzag with 7 bits of bit length
//! and then that many bits, then for each further row the delta-of-delta
//! `dod = (t[i] - t[i-1]) - (t[i-1] - t[i-2])` in buckets of 5 widths:
//!
//! | code    | default payload | covers (default)                                 |
//! |---------|-----------------|--------------------------------------------------|
//! | `0`     | —               | dod = 0                                          |
//! | `10`    | 12 bits of z    | abs(dod) < 2 µs                                  |
//! | `110`   | 17 bits         | abs(dod) < 65 µs                                 |
//! | `1110`  | 22 bits         | abs(dod) < 2.1 ms (a ≤ 1 ms jitter: all)         |
//! | `11110` | 32 bits         | abs(dod) < 2.1 s                                 |
//! | `11111` | 64 bits (fixed) | anything (wrapping: out of order, i64::MIN..MAX) |
//!
//! For a 1 s series with up to 1 ms of nanosecond jitter the optimized widths come out near
//! `10`+20, `110`+21, `1110`+22 bits (≈ 23 bits a row; the jitter's own entropy is ≈ 21 bits).
//!
//! **Doubles**: every column starts with a mode bit; the writer keeps both codings while both
//! are competitive and encodes the smaller one:
//!
//! - `0` = Gorilla XOR: the first value's 64 bits, then per row the XOR with the previous value:
//!   `0` same value; `10` + the meaningful bits inside the previous window; `11` + 5 bits of
//!   leading zeros + 6 bits of meaningful length − 1 + the meaningful bits (the writer takes `10`
//!   or `11`, whichever is shorter).
//! - `1` = decimal: the table bit (and widths), 3 bits of the scale `k` (0..=7), then per row the
//!   value as `m / 10^k` (exact to the bit: the writer checks that `(m as f64) / 10^k` gives back
//!   the very same bits), coded as the delta of `m` from the previous `m` in buckets of 6 widths,
//!   default `10`+4, `110`+8, `1110`+14, `11110`+22, `111110`+32, `1111110`+56 (fixed), and
//!   `1111111` = escape, followed by `0` + the raw 64 bits (NaN, -0.0, infinities, non-decimal
//!   values; `m` stays) or `1` + 3 bits of a larger scale (the previous `m` is rescaled) and then
//!   the value's code. A 2-decimal gauge random-walking by a few hundredths costs ~4-6 bits a
//!   value instead of ~46 with XOR.
//!
//! **Strings**: `rows` flag bits (`0` same as the previous row, the one before the first row
//! being `""`; `1` a new value), padded to a byte, then for each `1` flag a varint length and the
//! UTF-8 bytes.
//!
//! Decoding reads 64-bit words (one unaligned big-endian load per code, a table lookup on its
//! leading ones), allocates nothing per row, and checks everything: bounds, row counts against
//! byte lengths (each row costs at least a bit in every column), that every column ends exactly
//! at its end, and that the decoded timestamps match the header's last/min/max.

/// Version byte of the chunk format.
const MAGIC: u8 = 0xC1;

/// Default timestamp buckets (`10` .. `11110` + the fixed 64-bit `11111`).
const TS_CODES: Codes = Codes {
    w: [12, 17, 22, 32, 64, 0],
    n: 5,
    escape: false,
};

/// Default decimal buckets (`10` .. `1111110`, fixed 56 bits: |Δm| ≤ 2^54), `1111111` escape.
const DEC_CODES: Codes = Codes {
    w: [4, 8, 14, 22, 32, 56],
    n: 6,
    escape: true,
};

/// Largest decimal scale (3 bits).
const MAX_K: u32 = 7;
const POW10: [f64; 8] = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7];
const POW10_I: [i64; 8] = [1, 10, 100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000];
/// Decimal mantissas stay within ±2^53 (exact as f64, deltas fit the 56-bit bucket).
const MAX_M: i64 = 1 << 53;

/// The writer drops the worse double coding once it is this much larger (bits): 25 % + 256.
const PRUNE_SLACK_BITS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("corrupt chunk: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Shape(String),
}

fn corrupt(m: impl Into<String>) -> ChunkError {
    ChunkError::Corrupt(m.into())
}

#[inline]
fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

#[inline]
fn unzigzag(z: u64) -> i64 {
    ((z >> 1) as i64) ^ -((z & 1) as i64)
}

/// Bit length of `z` (0 for 0).
#[inline]
fn bit_len(z: u64) -> u32 {
    64 - z.leading_zeros()
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn varint_len(v: u64) -> usize {
    (bit_len(v | 1) as usize).div_ceil(7)
}

/// Reads a varint at `*pos` of `data`.
fn get_varint(data: &[u8], pos: &mut usize) -> Result<u64, ChunkError> {
    let mut v = 0u64;
    for i in 0..10 {
        let Some(&b) = data.get(*pos) else {
            return Err(corrupt("truncated varint"));
        };
        *pos += 1;
        if i == 9 && b > 1 {
            return Err(corrupt("varint overflow"));
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(corrupt("varint too long"))
}

fn get_usize(data: &[u8], pos: &mut usize) -> Result<usize, ChunkError> {
    usize::try_from(get_varint(data, pos)?).map_err(|_| corrupt("length out of range"))
}

// ---------------------------------------------------------------------------------------------
// Bits

/// Append-only bit stream, most significant bit first, in 64-bit words.
#[derive(Debug, Default, Clone)]
struct BitWriter {
    words: Vec<u64>,
    len: usize,
}

impl BitWriter {
    /// Appends the low `n` bits of `v` (`n` ≤ 64).
    #[inline]
    fn put(&mut self, v: u64, n: u32) {
        if n == 0 {
            return;
        }
        let v = if n == 64 { v } else { v & ((1u64 << n) - 1) };
        let used = (self.len & 63) as u32;
        if used == 0 {
            self.words.push(v << (64 - n));
        } else if let Some(last) = self.words.last_mut() {
            let free = 64 - used;
            if n <= free {
                *last |= v << (free - n);
            } else {
                *last |= v >> (n - free);
                self.words.push(v << (64 - (n - free)));
            }
        }
        self.len += n as usize;
    }

    /// A length-prefixed number: 7 bits of bit length, then the bits.
    fn put_sized(&mut self, v: u64) {
        let n = bit_len(v);
        self.put(u64::from(n), 7);
        self.put(v, n);
    }

    fn bytes(&self) -> usize {
        self.len.div_ceil(8)
    }

    /// Heap bytes it holds (its words' capacity).
    fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    fn write_to(&self, out: &mut Vec<u8>) {
        let mut left = self.bytes();
        for w in &self.words {
            let take = left.min(8);
            out.extend_from_slice(&w.to_be_bytes()[..take]);
            left -= take;
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes());
        self.write_to(&mut out);
        out
    }
}

/// Bit cursor over a byte slice; reading past the end yields 0 bits and is detected by
/// [`BitReader::overrun`] (checked once per decoded value).
struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> BitReader<'a> {
    fn new(data: &'a [u8]) -> Self {
        BitReader { data, pos: 0 }
    }

    /// The next bits, left-aligned; at least the top 57 are valid.
    #[inline(always)]
    fn peek(&self) -> u64 {
        let b = self.pos >> 3;
        let w = match self.data.get(b..).and_then(|s| s.first_chunk::<8>()) {
            Some(a) => u64::from_be_bytes(*a),
            None => self.peek_tail(b),
        };
        w << (self.pos & 7)
    }

    #[cold]
    #[inline(never)]
    fn peek_tail(&self, b: usize) -> u64 {
        let mut a = [0u8; 8];
        if let Some(s) = self.data.get(b..) {
            let n = s.len().min(8);
            a[..n].copy_from_slice(&s[..n]);
        }
        u64::from_be_bytes(a)
    }

    /// Reads `n` bits, 1 ≤ n ≤ 57.
    #[inline(always)]
    fn read(&mut self, n: u32) -> u64 {
        let v = self.peek() >> (64 - n);
        self.pos += n as usize;
        v
    }

    /// Reads `n` bits, 0 ≤ n ≤ 64.
    #[inline(always)]
    fn read_long(&mut self, n: u32) -> u64 {
        if n == 0 {
            0
        } else if n <= 57 {
            self.read(n)
        } else {
            let hi = self.read(n - 32);
            (hi << 32) | self.read(32)
        }
    }

    /// Reads what [`BitWriter::put_sized`] wrote.
    fn read_sized(&mut self) -> Result<u64, ChunkError> {
        let n = self.read(7) as u32;
        if n > 64 {
            return Err(corrupt("sized number longer than 64 bits"));
        }
        Ok(self.read_long(n))
    }

    #[inline(always)]
    fn skip(&mut self, n: u32) {
        self.pos += n as usize;
    }

    #[inline(always)]
    fn overrun(&self) -> bool {
        self.pos > self.data.len() * 8
    }

    /// The stream must end in the last byte of the column (only padding after it).
    fn finish(&self, what: &str) -> Result<(), ChunkError> {
        if self.pos.div_ceil(8) != self.data.len() {
            return Err(corrupt(format!(
                "{what}: {} bits for {} bytes",
                self.pos,
                self.data.len()
            )));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Bucket codes

/// A prefix code of zigzag integers: `0` = 0, then bucket `j` = `j + 1` one bits (+ a `0`
/// unless it is the last bucket of a code without escape) + `w[j]` payload bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Codes {
    w: [u32; 6],
    /// Buckets; the last one's width is fixed by the format.
    n: usize,
    /// `n + 1` one bits are an escape.
    escape: bool,
}

/// Decoding of a code by its leading one bits (capped at 8).
#[derive(Debug, Clone, Copy)]
struct Entry {
    kind: u8,
    /// Prefix bits.
    plen: u32,
    width: u32,
}

const K_ZERO: u8 = 0;
const K_VALUE: u8 = 1;
const K_ESCAPE: u8 = 2;

type Lut = [Entry; 9];

impl Codes {
    /// Prefix bits and their count of bucket `j`.
    #[inline]
    fn prefix(&self, j: usize) -> (u64, u32) {
        let ones = j as u32 + 1;
        if j + 1 < self.n || self.escape {
            (((1u64 << ones) - 1) << 1, ones + 1)
        } else {
            ((1u64 << ones) - 1, ones)
        }
    }

    /// Bits a value of bit length `l` ≥ 1 takes (None: too long for every bucket).
    fn cost(&self, l: u32) -> Option<u32> {
        (0..self.n)
            .find(|&j| l <= self.w[j])
            .map(|j| self.prefix(j).1 + self.w[j])
    }

    /// Writes `z`; its bit length must fit the last bucket.
    #[inline]
    fn put(&self, out: &mut BitWriter, z: u64) {
        if z == 0 {
            out.put(0, 1);
            return;
        }
        let l = bit_len(z);
        for j in 0..self.n {
            let w = self.w[j];
            if l <= w {
                let (p, plen) = self.prefix(j);
                if plen + w <= 64 {
                    out.put((p << w) | z, plen + w);
                } else {
                    out.put(p, plen);
                    out.put(z, w);
                }
                return;
            }
        }
    }

    fn put_escape(&self, out: &mut BitWriter) {
        let n = self.n as u32 + 1;
        out.put((1 << n) - 1, n);
    }

    /// The table bit and, if `self` is not `default`, the widths of all buckets but the last.
    fn put_table(&self, out: &mut BitWriter, default: &Codes) {
        if self == default {
            out.put(0, 1);
        } else {
            out.put(1, 1);
            for &w in &self.w[..self.n - 1] {
                out.put(u64::from(w - 1), 6);
            }
        }
    }

    /// Reads what [`Codes::put_table`] wrote.
    fn read_table(r: &mut BitReader<'_>, default: &Codes) -> Codes {
        let mut c = *default;
        if r.read(1) == 1 {
            for w in &mut c.w[..c.n - 1] {
                *w = r.read(6) as u32 + 1;
            }
        }
        c
    }

    fn lut(&self) -> Lut {
        let mut t = [Entry {
            kind: K_ZERO,
            plen: 1,
            width: 0,
        }; 9];
        for (ones, e) in t.iter_mut().enumerate().skip(1) {
            let j = ones - 1;
            *e = if j < self.n {
                let (_, plen) = self.prefix(j);
                Entry {
                    kind: K_VALUE,
                    plen,
                    width: self.w[j],
                }
            } else if self.escape {
                Entry {
                    kind: K_ESCAPE,
                    plen: self.n as u32 + 1,
                    width: 0,
                }
            } else {
                let j = self.n - 1;
                Entry {
                    kind: K_VALUE,
                    plen: self.prefix(j).1,
                    width: self.w[j],
                }
            };
        }
        t
    }

    /// The widths minimizing the bits of values whose bit lengths have histogram `hist`
    /// (`hist[l]` values of bit length `l`, 1..=64): returns them with the bits the values would
    /// take plus the table's extra bits. Dynamic program over the distinct lengths: bucket `j`
    /// takes a contiguous run of them and has the width of its longest.
    fn optimize(&self, hist: &[u32; 65]) -> (Codes, u64) {
        let mut ls = [0u32; 64];
        let mut cum = [0u64; 65]; // cum[i]: values with the i shortest lengths
        let mut n = 0;
        for l in 1..=64u32 {
            if hist[l as usize] > 0 {
                ls[n] = l;
                cum[n + 1] = cum[n] + u64::from(hist[l as usize]);
                n += 1;
            }
        }
        let m = self.n - 1; // free buckets
        let last = self.n - 1;
        let last_cost = u64::from(self.prefix(last).1 + self.w[last]);
        const INF: u64 = u64::MAX;
        // f[j][i]: least bits of the i shortest lengths in buckets 0..j, each non-empty.
        let mut f = [[INF; 65]; 6];
        let mut arg = [[0u8; 65]; 6];
        f[0][0] = 0;
        for j in 1..=m {
            let plen = u64::from(self.prefix(j - 1).1);
            for i in j..=n {
                let width = u64::from(ls[i - 1]);
                for k in j - 1..i {
                    if f[j - 1][k] == INF {
                        continue;
                    }
                    let c = f[j - 1][k] + (plen + width) * (cum[i] - cum[k]);
                    if c < f[j][i] {
                        f[j][i] = c;
                        arg[j][i] = k as u8;
                    }
                }
            }
        }
        // The rest goes to the fixed last bucket (it holds every length the writer produces).
        let (mut best, mut bj, mut bi) = (INF, 0, 0);
        for (j, row) in f.iter().enumerate().take(m + 1) {
            for (i, &c) in row.iter().enumerate().take(n + 1) {
                if c != INF && (ls[i..n].iter().all(|&l| l <= self.w[last])) {
                    let total = c + last_cost * (cum[n] - cum[i]);
                    if total < best {
                        (best, bj, bi) = (total, j, i);
                    }
                }
            }
        }
        let mut c = *self;
        let mut i = bi;
        for j in (1..=bj).rev() {
            c.w[j - 1] = ls[i - 1];
            i = arg[j][i] as usize;
        }
        let top = if bj == 0 { 1 } else { c.w[bj - 1] };
        for w in &mut c.w[bj..m] {
            *w = top; // unused: catch nothing the buckets before them do not
        }
        (c, best + 6 * m as u64)
    }

    /// Bits of values with histogram `hist` in these (default) buckets.
    fn cost_of(&self, hist: &[u32; 65]) -> u64 {
        (1..=64u32)
            .filter(|&l| hist[l as usize] > 0)
            .map(|l| u64::from(hist[l as usize]) * u64::from(self.cost(l).unwrap_or(64 + 8)))
            .sum()
    }

    /// The codes to encode with and the column's bits, given the stream of `bits` bits written
    /// with `self` and the histogram of its bucketed values.
    fn plan(&self, bits: usize, hist: &[u32; 65]) -> (Codes, usize) {
        let (c, opt) = self.optimize(hist);
        let base = self.cost_of(hist);
        if c != *self && opt < base {
            (c, bits - (base - opt) as usize)
        } else {
            (*self, bits)
        }
    }
}

/// `hist[l]`: how many values of bit length `l` a column holds (l = 1..=64), in 16-bit
/// counters (it is held by every column of every open chunk: 130 bytes instead of 260). A
/// chunk with more than 65,535 values of one length (only with `chunk_rows` above that) is
/// `full`: its column keeps the default buckets, whose bits are exact without the histogram.
#[derive(Debug, Clone)]
struct Hist {
    n: [u16; 65],
    full: bool,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            n: [0; 65],
            full: false,
        }
    }
}

impl Hist {
    #[inline]
    fn add(&mut self, z: u64) {
        let c = &mut self.n[bit_len(z) as usize];
        match c.checked_add(1) {
            Some(v) => *c = v,
            None => self.full = true,
        }
    }

    /// [`Codes::plan`] over this histogram; the default buckets when it is full.
    fn plan(&self, default: &Codes, bits: usize) -> (Codes, usize) {
        if self.full {
            return (*default, bits);
        }
        default.plan(bits, &self.n.map(u32::from))
    }
}

/// Reads one bucket code: `Some(z)`, or None for the escape.
#[inline(always)]
fn get_code(r: &mut BitReader<'_>, lut: &Lut) -> Option<u64> {
    let w = r.peek();
    let e = lut[w.leading_ones().min(8) as usize];
    match e.kind {
        K_ZERO => {
            r.skip(1);
            Some(0)
        }
        K_VALUE => {
            if e.plen + e.width <= 57 {
                r.skip(e.plen + e.width);
                Some((w << e.plen) >> (64 - e.width))
            } else {
                r.skip(e.plen);
                Some(r.read_long(e.width))
            }
        }
        _ => {
            r.skip(e.plen);
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Timestamps

/// The timestamp column being written (with the default buckets; re-coded by `encode` when
/// other widths are shorter).
#[derive(Debug, Clone, Default)]
struct TsEnc {
    bits: BitWriter,
    prev: i64,
    delta: i64,
    /// Deltas written (rows - 1).
    deltas: usize,
    hist: Hist,
}

impl TsEnc {
    fn push(&mut self, first: bool, ts: i64) {
        if first {
            self.prev = ts;
            return;
        }
        let delta = ts.wrapping_sub(self.prev);
        if self.deltas == 0 {
            TS_CODES.put_table(&mut self.bits, &TS_CODES);
            self.bits.put_sized(zigzag(delta));
        } else {
            let z = zigzag(delta.wrapping_sub(self.delta));
            TS_CODES.put(&mut self.bits, z);
            self.hist.add(z);
        }
        self.deltas += 1;
        self.delta = delta;
        self.prev = ts;
    }

    fn plan(&self) -> (Codes, usize) {
        self.hist.plan(&TS_CODES, self.bits.len)
    }

    /// Writes the column with `codes` (from [`TsEnc::plan`]).
    fn write_to(&self, codes: Codes, out: &mut Vec<u8>) {
        if codes == TS_CODES {
            return self.bits.write_to(out);
        }
        let bytes = self.bits.to_bytes();
        let mut r = BitReader::new(&bytes);
        let lut = TS_CODES.lut();
        let mut w = BitWriter::default();
        let _ = Codes::read_table(&mut r, &TS_CODES);
        codes.put_table(&mut w, &TS_CODES);
        w.put_sized(r.read_sized().unwrap_or(0));
        for _ in 1..self.deltas {
            codes.put(&mut w, get_code(&mut r, &lut).unwrap_or(0));
        }
        w.write_to(out);
    }
}

struct TsDec<'a> {
    r: BitReader<'a>,
    lut: Lut,
    /// 0: next is the first row, 1: the second, 2: later.
    state: u8,
    first_delta: i64,
    prev: i64,
    delta: i64,
    min: i64,
    max: i64,
}

impl<'a> TsDec<'a> {
    fn new(col: &'a [u8], first: i64, rows: usize) -> Result<Self, ChunkError> {
        let mut r = BitReader::new(col);
        let (mut codes, mut first_delta) = (TS_CODES, 0);
        if rows >= 2 {
            codes = Codes::read_table(&mut r, &TS_CODES);
            first_delta = unzigzag(r.read_sized()?);
        }
        Ok(TsDec {
            r,
            lut: codes.lut(),
            state: 0,
            first_delta,
            prev: first,
            delta: 0,
            min: first,
            max: first,
        })
    }

    #[inline(always)]
    fn next(&mut self) -> Result<i64, ChunkError> {
        let dod = match self.state {
            2 => match get_code(&mut self.r, &self.lut) {
                Some(z) => unzigzag(z),
                None => return Err(corrupt("escape in the timestamp column")),
            },
            1 => {
                self.state = 2;
                self.first_delta
            }
            _ => {
                self.state = 1;
                return Ok(self.prev);
            }
        };
        if self.r.overrun() {
            return Err(corrupt("timestamp column too short"));
        }
        self.delta = self.delta.wrapping_add(dod);
        self.prev = self.prev.wrapping_add(self.delta);
        self.min = self.min.min(self.prev);
        self.max = self.max.max(self.prev);
        Ok(self.prev)
    }

    fn finish(&self, h: &ChunkReader<'_>) -> Result<(), ChunkError> {
        self.r.finish("timestamp column")?;
        if (self.prev, self.min, self.max) != (h.last_ts, h.min_ts, h.max_ts) {
            return Err(corrupt("timestamps disagree with the header"));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Doubles: Gorilla XOR

#[derive(Debug, Clone, Default)]
struct XorEnc {
    bits: BitWriter,
    started: bool,
    prev: u64,
    lead: u32,
    trail: u32,
    has_window: bool,
}

impl XorEnc {
    fn new() -> Self {
        let mut e = XorEnc::default();
        e.bits.put(0, 1); // mode bit
        e
    }

    fn push(&mut self, v: f64) {
        let v = v.to_bits();
        if !self.started {
            self.started = true;
            self.prev = v;
            self.bits.put(v, 64);
            return;
        }
        let x = v ^ self.prev;
        self.prev = v;
        if x == 0 {
            self.bits.put(0, 1);
            return;
        }
        let lz = x.leading_zeros().min(31);
        let tz = x.trailing_zeros();
        let meaningful = 64 - lz - tz;
        let fits = self.has_window && lz >= self.lead && tz >= self.trail;
        let window = 64 - self.lead - self.trail;
        if fits && window <= 11 + meaningful {
            self.bits.put(0b10, 2);
            self.bits.put(x >> self.trail, window);
        } else {
            self.bits.put(
                (0b11 << 11) | (u64::from(lz) << 6) | u64::from(meaningful - 1),
                13,
            );
            self.bits.put(x >> tz, meaningful);
            self.lead = lz;
            self.trail = tz;
            self.has_window = true;
        }
    }
}

struct XorDec<'a> {
    r: BitReader<'a>,
    started: bool,
    prev: u64,
    /// Window: trailing zeros and width (0 = none yet).
    trail: u32,
    width: u32,
}

impl XorDec<'_> {
    #[inline(always)]
    fn next(&mut self) -> Result<f64, ChunkError> {
        if !self.started {
            self.started = true;
            self.prev = self.r.read_long(64);
        } else {
            let w = self.r.peek();
            if w >> 63 == 1 {
                if (w >> 62) & 1 == 0 {
                    if self.width == 0 {
                        return Err(corrupt("XOR window reused before set"));
                    }
                    self.r.skip(2);
                } else {
                    let lead = ((w >> 57) & 31) as u32;
                    let width = ((w >> 51) & 63) as u32 + 1;
                    if lead + width > 64 {
                        return Err(corrupt("XOR window out of range"));
                    }
                    self.r.skip(13);
                    self.width = width;
                    self.trail = 64 - lead - width;
                }
                let bits = self.r.read_long(self.width);
                // trail < 64 since width >= 1.
                self.prev ^= bits << self.trail;
            } else {
                self.r.skip(1);
            }
        }
        if self.r.overrun() {
            return Err(corrupt("double column too short"));
        }
        Ok(f64::from_bits(self.prev))
    }
}

// ---------------------------------------------------------------------------------------------
// Doubles: decimal

/// `Some(m)` when `v` is exactly `(m as f64) / 10^k` with |m| ≤ 2^53.
#[inline]
fn fit_decimal(v: f64, k: u32) -> Option<i64> {
    let p = POW10[k as usize];
    let s = v * p;
    if s.is_nan() || s.abs() > MAX_M as f64 {
        return None;
    }
    let m = s.round() as i64;
    ((m as f64 / p).to_bits() == v.to_bits()).then_some(m)
}

/// The decimal coding of a column being written (default buckets; re-coded by `encode` when
/// other widths are shorter).
#[derive(Debug, Clone, Default)]
struct DecEnc {
    bits: BitWriter,
    values: usize,
    k: u32,
    prev_m: i64,
    hist: Hist,
}

impl DecEnc {
    fn new() -> Self {
        let mut e = DecEnc::default();
        e.bits.put(1, 1); // mode bit
        DEC_CODES.put_table(&mut e.bits, &DEC_CODES);
        e
    }

    fn put_delta(&mut self, d: i64) {
        let z = zigzag(d);
        DEC_CODES.put(&mut self.bits, z);
        self.hist.add(z);
    }

    fn push(&mut self, v: f64) {
        if self.values == 0 {
            self.k = (0..=MAX_K).find(|&k| fit_decimal(v, k).is_some()).unwrap_or(0);
            self.bits.put(u64::from(self.k), 3);
        }
        self.values += 1;
        if let Some(m) = fit_decimal(v, self.k) {
            self.put_delta(m - self.prev_m);
            self.prev_m = m;
            return;
        }
        for k in self.k + 1..=MAX_K {
            let Some(m) = fit_decimal(v, k) else { continue };
            let Some(prev) = self.prev_m.checked_mul(POW10_I[(k - self.k) as usize]) else {
                break;
            };
            if prev.abs() > MAX_M {
                break;
            }
            DEC_CODES.put_escape(&mut self.bits);
            self.bits.put(0b1000 | u64::from(k), 4);
            self.k = k;
            self.put_delta(m - prev);
            self.prev_m = m;
            return;
        }
        DEC_CODES.put_escape(&mut self.bits);
        self.bits.put(0, 1);
        self.bits.put(v.to_bits(), 64);
    }

    fn plan(&self) -> (Codes, usize) {
        self.hist.plan(&DEC_CODES, self.bits.len)
    }

    /// Writes the column with `codes` (from [`DecEnc::plan`]).
    fn write_to(&self, codes: Codes, out: &mut Vec<u8>) {
        if codes == DEC_CODES {
            return self.bits.write_to(out);
        }
        let bytes = self.bits.to_bytes();
        let mut r = BitReader::new(&bytes);
        let lut = DEC_CODES.lut();
        let mut w = BitWriter::default();
        w.put(r.read(1), 1);
        let _ = Codes::read_table(&mut r, &DEC_CODES);
        codes.put_table(&mut w, &DEC_CODES);
        w.put(r.read(3), 3);
        let mut values = 0;
        while values < self.values && !r.overrun() {
            match get_code(&mut r, &lut) {
                Some(z) => {
                    codes.put(&mut w, z);
                    values += 1;
                }
                None => {
                    codes.put_escape(&mut w);
                    if r.read(1) == 0 {
                        w.put(0, 1);
                        w.put(r.read_long(64), 64);
                        values += 1;
                    } else {
                        w.put(0b1000 | r.read(3), 4);
                    }
                }
            }
        }
        w.write_to(out);
    }
}

struct DecDec<'a> {
    r: BitReader<'a>,
    lut: Lut,
    k: u32,
    prev_m: i64,
}

impl DecDec<'_> {
    #[inline(always)]
    fn next(&mut self) -> Result<f64, ChunkError> {
        let v = loop {
            match get_code(&mut self.r, &self.lut) {
                Some(z) => {
                    self.prev_m = self.prev_m.wrapping_add(unzigzag(z));
                    break self.prev_m as f64 / POW10[self.k as usize];
                }
                None => {
                    if self.r.read(1) == 0 {
                        break f64::from_bits(self.r.read_long(64));
                    }
                    let k = self.r.read(3) as u32;
                    if k <= self.k {
                        return Err(corrupt("decimal scale does not grow"));
                    }
                    self.prev_m = self
                        .prev_m
                        .checked_mul(POW10_I[(k - self.k) as usize])
                        .ok_or_else(|| corrupt("decimal rescale overflow"))?;
                    self.k = k;
                }
            }
        };
        if self.r.overrun() {
            return Err(corrupt("double column too short"));
        }
        Ok(v)
    }
}

// ---------------------------------------------------------------------------------------------
// Doubles: column

/// A double column being written: both codings while both are competitive.
#[derive(Debug, Clone)]
enum DoubleEnc {
    Both(XorEnc, DecEnc),
    Xor(XorEnc),
    Dec(DecEnc),
}

impl DoubleEnc {
    fn push(&mut self, v: f64) {
        match self {
            DoubleEnc::Both(x, d) => {
                x.push(v);
                d.push(v);
                let (a, b) = (x.bits.len, d.bits.len);
                if b > a + a / 4 + PRUNE_SLACK_BITS {
                    *self = DoubleEnc::Xor(std::mem::take(x));
                } else if a > b + b / 4 + PRUNE_SLACK_BITS {
                    *self = DoubleEnc::Dec(std::mem::take(d));
                }
            }
            DoubleEnc::Xor(x) => x.push(v),
            DoubleEnc::Dec(d) => d.push(v),
        }
    }

    /// The coding to write (None: XOR, else decimal with these buckets) and its bits.
    fn plan(&self) -> (Option<Codes>, usize) {
        match self {
            DoubleEnc::Both(x, d) => {
                let (codes, bits) = d.plan();
                if bits <= x.bits.len {
                    (Some(codes), bits)
                } else {
                    (None, x.bits.len)
                }
            }
            DoubleEnc::Xor(x) => (None, x.bits.len),
            DoubleEnc::Dec(d) => {
                let (codes, bits) = d.plan();
                (Some(codes), bits)
            }
        }
    }

    /// Writes the column as `plan` (from [`DoubleEnc::plan`]) says.
    fn write_to(&self, plan: Option<Codes>, out: &mut Vec<u8>) {
        match (self, plan) {
            (DoubleEnc::Both(_, d) | DoubleEnc::Dec(d), Some(codes)) => d.write_to(codes, out),
            (DoubleEnc::Both(x, _) | DoubleEnc::Xor(x), _) => x.bits.write_to(out),
            // Not planned by `plan`.
            (DoubleEnc::Dec(d), None) => d.write_to(d.plan().0, out),
        }
    }
}

enum DoubleDec<'a> {
    Xor(XorDec<'a>),
    Dec(DecDec<'a>),
}

impl<'a> DoubleDec<'a> {
    fn new(col: &'a [u8]) -> Self {
        let mut r = BitReader::new(col);
        if r.read(1) == 0 {
            DoubleDec::Xor(XorDec {
                r,
                started: false,
                prev: 0,
                trail: 0,
                width: 0,
            })
        } else {
            let codes = Codes::read_table(&mut r, &DEC_CODES);
            let k = r.read(3) as u32;
            DoubleDec::Dec(DecDec {
                r,
                lut: codes.lut(),
                k,
                prev_m: 0,
            })
        }
    }

    #[inline]
    fn next(&mut self) -> Result<f64, ChunkError> {
        match self {
            DoubleDec::Xor(d) => d.next(),
            DoubleDec::Dec(d) => d.next(),
        }
    }

    fn finish(&self) -> Result<(), ChunkError> {
        match self {
            DoubleDec::Xor(d) => d.r.finish("double column"),
            DoubleDec::Dec(d) => d.r.finish("double column"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Strings

#[derive(Debug, Clone, Default)]
struct StrEnc {
    flags: BitWriter,
    payload: Vec<u8>,
    prev: String,
}

impl StrEnc {
    fn push(&mut self, s: &str) {
        if s == self.prev {
            self.flags.put(0, 1);
        } else {
            self.flags.put(1, 1);
            put_varint(&mut self.payload, s.len() as u64);
            self.payload.extend_from_slice(s.as_bytes());
            self.prev.clear();
            self.prev.push_str(s);
        }
    }
}

struct StrDec<'a> {
    flags: BitReader<'a>,
    payload: &'a [u8],
    off: usize,
    cur: &'a str,
}

impl<'a> StrDec<'a> {
    /// `col` holds at least `rows.div_ceil(8)` bytes (checked by the reader).
    fn new(col: &'a [u8], rows: usize) -> Self {
        let (flags, payload) = col.split_at(rows.div_ceil(8).min(col.len()));
        StrDec {
            flags: BitReader::new(flags),
            payload,
            off: 0,
            cur: "",
        }
    }

    /// The next row's string and whether it differs from the previous row's.
    #[inline]
    fn next(&mut self) -> Result<(&'a str, bool), ChunkError> {
        if self.flags.read(1) == 0 {
            return Ok((self.cur, false));
        }
        let len = get_usize(self.payload, &mut self.off)?;
        let bytes = self
            .off
            .checked_add(len)
            .and_then(|end| self.payload.get(self.off..end))
            .ok_or_else(|| corrupt("string past the column end"))?;
        self.cur = std::str::from_utf8(bytes).map_err(|_| corrupt("string is not UTF-8"))?;
        self.off += len;
        Ok((self.cur, true))
    }

    fn finish(&self) -> Result<(), ChunkError> {
        if self.off != self.payload.len() {
            return Err(corrupt("string column has trailing bytes"));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Writer

/// Builds a chunk incrementally (append-only, O(1) amortized per row).
#[derive(Debug, Clone)]
pub struct ChunkWriter {
    n_doubles: usize,
    n_strings: usize,
    rows: usize,
    first: i64,
    last: i64,
    min: i64,
    max: i64,
    ts: TsEnc,
    doubles: Vec<DoubleEnc>,
    strings: Vec<StrEnc>,
}

impl ChunkWriter {
    pub fn new(n_doubles: usize, n_strings: usize) -> ChunkWriter {
        ChunkWriter {
            n_doubles,
            n_strings,
            rows: 0,
            first: 0,
            last: 0,
            min: 0,
            max: 0,
            ts: TsEnc::default(),
            doubles: (0..n_doubles)
                .map(|_| DoubleEnc::Both(XorEnc::new(), DecEnc::new()))
                .collect(),
            strings: (0..n_strings).map(|_| StrEnc::default()).collect(),
        }
    }

    /// Appends a row; Err(Shape) if the slice lengths differ from the chunk's shape.
    pub fn push(&mut self, ts_ns: i64, doubles: &[f64], strings: &[&str]) -> Result<(), ChunkError> {
        if doubles.len() != self.n_doubles || strings.len() != self.n_strings {
            return Err(ChunkError::Shape(format!(
                "row has {} doubles and {} strings, the chunk {} and {}",
                doubles.len(),
                strings.len(),
                self.n_doubles,
                self.n_strings
            )));
        }
        if self.rows >= u32::MAX as usize {
            return Err(ChunkError::Shape("chunk is full (u32::MAX rows)".into()));
        }
        let first = self.rows == 0;
        self.ts.push(first, ts_ns);
        if first {
            (self.first, self.min, self.max) = (ts_ns, ts_ns, ts_ns);
        } else {
            self.min = self.min.min(ts_ns);
            self.max = self.max.max(ts_ns);
        }
        self.last = ts_ns;
        for (c, &v) in self.doubles.iter_mut().zip(doubles) {
            c.push(v);
        }
        for (c, s) in self.strings.iter_mut().zip(strings) {
            c.push(s);
        }
        self.rows += 1;
        Ok(())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Bytes the writer holds on the heap: its column encoders (both codings of a double column
    /// while both are competitive) and their bit streams' capacity. What an open chunk costs in
    /// memory (docs/archiver.md, "Memory, term by term").
    pub fn heap_bytes(&self) -> usize {
        let doubles: usize = self
            .doubles
            .iter()
            .map(|d| match d {
                DoubleEnc::Both(x, d) => x.bits.heap_bytes() + d.bits.heap_bytes(),
                DoubleEnc::Xor(x) => x.bits.heap_bytes(),
                DoubleEnc::Dec(d) => d.bits.heap_bytes(),
            })
            .sum();
        let strings: usize = self
            .strings
            .iter()
            .map(|s| s.flags.heap_bytes() + s.payload.capacity() + s.prev.capacity())
            .sum();
        self.doubles.capacity() * std::mem::size_of::<DoubleEnc>()
            + self.strings.capacity() * std::mem::size_of::<StrEnc>()
            + self.ts.bits.heap_bytes()
            + doubles
            + strings
    }

    /// Timestamp of the first row.
    pub fn first_ts(&self) -> Option<i64> {
        (self.rows > 0).then_some(self.first)
    }

    /// Timestamp of the last row.
    pub fn last_ts(&self) -> Option<i64> {
        (self.rows > 0).then_some(self.last)
    }

    pub fn min_ts(&self) -> Option<i64> {
        (self.rows > 0).then_some(self.min)
    }

    pub fn max_ts(&self) -> Option<i64> {
        (self.rows > 0).then_some(self.max)
    }

    /// The byte length of each column (given the plans of the timestamp and double columns).
    fn col_lens<'s>(
        &'s self,
        ts_bits: usize,
        double_bits: impl Iterator<Item = usize> + 's,
    ) -> impl Iterator<Item = usize> + 's {
        let rows = self.rows;
        let s = self
            .strings
            .iter()
            .map(move |s| rows.div_ceil(8) + s.payload.len());
        std::iter::once(ts_bits)
            .chain(double_bits)
            .map(|bits| bits.div_ceil(8))
            .chain(s)
            .map(move |l| if rows == 0 { 0 } else { l })
    }

    fn header_len(&self) -> usize {
        1 + 8 + self.header_fields().iter().map(|&v| varint_len(v)).sum::<usize>()
    }

    fn header_fields(&self) -> [u64; 6] {
        [
            self.rows as u64,
            self.n_doubles as u64,
            self.n_strings as u64,
            zigzag(self.last.wrapping_sub(self.first)),
            zigzag(self.min.wrapping_sub(self.first)),
            zigzag(self.max.wrapping_sub(self.first)),
        ]
    }

    /// Bytes the encoded chunk takes now (exact; O(columns), not O(rows)).
    pub fn encoded_len(&self) -> usize {
        let lens = self.col_lens(self.ts.plan().1, self.doubles.iter().map(|d| d.plan().1));
        self.header_len() + lens.map(|l| varint_len(l as u64) + l).sum::<usize>()
    }

    /// The encoded chunk of all rows so far (does not consume: more rows may follow).
    pub fn encode(&self) -> Vec<u8> {
        let (ts_codes, ts_bits) = self.ts.plan();
        let plans: Vec<(Option<Codes>, usize)> = self.doubles.iter().map(DoubleEnc::plan).collect();
        let lens: Vec<usize> = self.col_lens(ts_bits, plans.iter().map(|p| p.1)).collect();
        let size = self.header_len() + lens.iter().map(|&l| varint_len(l as u64) + l).sum::<usize>();
        let mut out = Vec::with_capacity(size);
        out.push(MAGIC);
        let [rows, nd, ns, last, min, max] = self.header_fields();
        for v in [rows, nd, ns] {
            put_varint(&mut out, v);
        }
        out.extend_from_slice(&self.first.to_le_bytes());
        for v in [last, min, max] {
            put_varint(&mut out, v);
        }
        for &l in &lens {
            put_varint(&mut out, l as u64);
        }
        if self.rows > 0 {
            self.ts.write_to(ts_codes, &mut out);
            for (c, p) in self.doubles.iter().zip(plans) {
                c.write_to(p.0, &mut out);
            }
            for c in &self.strings {
                c.flags.write_to(&mut out);
                out.extend_from_slice(&c.payload);
            }
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// Reader

/// Reads an encoded chunk; validates the header and column bounds up front (never panics on any
/// input bytes; returns [`ChunkError::Corrupt`]).
#[derive(Debug, Clone)]
pub struct ChunkReader<'a> {
    rows: usize,
    n_doubles: usize,
    n_strings: usize,
    first_ts: i64,
    last_ts: i64,
    min_ts: i64,
    max_ts: i64,
    /// Timestamps, doubles..., strings...
    cols: Vec<&'a [u8]>,
}

impl<'a> ChunkReader<'a> {
    pub fn new(bytes: &'a [u8]) -> Result<ChunkReader<'a>, ChunkError> {
        let Some((&magic, _)) = bytes.split_first() else {
            return Err(corrupt("empty"));
        };
        if magic != MAGIC {
            return Err(corrupt(format!("unknown format byte {magic:#04x}")));
        }
        let mut pos = 1;
        let rows = get_varint(bytes, &mut pos)?;
        if rows > u64::from(u32::MAX) {
            return Err(corrupt("too many rows"));
        }
        let rows = rows as usize;
        let n_doubles = get_usize(bytes, &mut pos)?;
        let n_strings = get_usize(bytes, &mut pos)?;
        let first_ts = bytes
            .get(pos..)
            .and_then(|s| s.first_chunk::<8>())
            .map(|a| i64::from_le_bytes(*a))
            .ok_or_else(|| corrupt("truncated header"))?;
        pos += 8;
        let mut rel = || get_varint(bytes, &mut pos).map(|z| first_ts.wrapping_add(unzigzag(z)));
        let (last_ts, min_ts, max_ts) = (rel()?, rel()?, rel()?);
        if !(min_ts <= first_ts && first_ts <= max_ts && min_ts <= last_ts && last_ts <= max_ts) {
            return Err(corrupt("inconsistent timestamp range"));
        }
        if rows <= 1 && (first_ts, first_ts, first_ts) != (last_ts, min_ts, max_ts) {
            return Err(corrupt("inconsistent timestamp range"));
        }
        // Each column's length takes at least one byte: bounds the allocations below.
        let n_cols = n_doubles
            .checked_add(n_strings)
            .and_then(|n| n.checked_add(1))
            .filter(|&n| n <= bytes.len().saturating_sub(pos))
            .ok_or_else(|| corrupt("too many columns for the chunk size"))?;
        let mut lens = Vec::with_capacity(n_cols);
        for _ in 0..n_cols {
            lens.push(get_usize(bytes, &mut pos)?);
        }
        let mut cols = Vec::with_capacity(n_cols);
        for (i, &len) in lens.iter().enumerate() {
            let col = pos
                .checked_add(len)
                .and_then(|end| bytes.get(pos..end))
                .ok_or_else(|| corrupt("column past the chunk end"))?;
            pos += len;
            let bits = len.saturating_mul(8);
            let ok = if rows == 0 || (rows == 1 && i == 0) {
                len == 0
            } else if i == 0 {
                // every row after the first costs at least a bit
                rows - 1 <= bits
            } else {
                rows <= bits && (i <= n_doubles || rows.div_ceil(8) <= len)
            };
            if !ok {
                return Err(corrupt(format!("column {i}: {len} bytes do not fit {rows} rows")));
            }
            cols.push(col);
        }
        if pos != bytes.len() {
            return Err(corrupt("trailing bytes"));
        }
        Ok(ChunkReader {
            rows,
            n_doubles,
            n_strings,
            first_ts,
            last_ts,
            min_ts,
            max_ts,
            cols,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn n_doubles(&self) -> usize {
        self.n_doubles
    }

    pub fn n_strings(&self) -> usize {
        self.n_strings
    }

    pub fn first_ts(&self) -> i64 {
        self.first_ts
    }

    pub fn last_ts(&self) -> i64 {
        self.last_ts
    }

    pub fn min_ts(&self) -> i64 {
        self.min_ts
    }

    pub fn max_ts(&self) -> i64 {
        self.max_ts
    }

    fn ts_dec(&self) -> Result<TsDec<'a>, ChunkError> {
        TsDec::new(self.cols[0], self.first_ts, self.rows)
    }

    /// All timestamps in row order.
    pub fn timestamps(&self) -> Result<Vec<i64>, ChunkError> {
        // rows is bounded by the column's byte length (checked in new).
        let mut out = Vec::with_capacity(self.rows);
        if self.rows == 0 {
            return Ok(out);
        }
        let mut d = self.ts_dec()?;
        for _ in 0..self.rows {
            out.push(d.next()?);
        }
        d.finish(self)?;
        Ok(out)
    }

    /// Calls f(ts, value) for every row of double column `col`, in row order (decodes only the
    /// timestamp column and that column). Err if col is out of range or the data is corrupt.
    pub fn for_each_double(&self, col: usize, mut f: impl FnMut(i64, f64)) -> Result<(), ChunkError> {
        if col >= self.n_doubles {
            return Err(ChunkError::Shape(format!(
                "double column {col} out of range (the chunk has {})",
                self.n_doubles
            )));
        }
        if self.rows == 0 {
            return Ok(());
        }
        let mut t = self.ts_dec()?;
        // One loop per coding: no dispatch per value.
        match DoubleDec::new(self.cols[1 + col]) {
            DoubleDec::Xor(mut d) => {
                for _ in 0..self.rows {
                    f(t.next()?, d.next()?);
                }
                d.r.finish("double column")?;
            }
            DoubleDec::Dec(mut d) => {
                for _ in 0..self.rows {
                    f(t.next()?, d.next()?);
                }
                d.r.finish("double column")?;
            }
        }
        t.finish(self)
    }

    /// Same for string column `col`.
    pub fn for_each_string(&self, col: usize, mut f: impl FnMut(i64, &str)) -> Result<(), ChunkError> {
        if col >= self.n_strings {
            return Err(ChunkError::Shape(format!(
                "string column {col} out of range (the chunk has {})",
                self.n_strings
            )));
        }
        if self.rows == 0 {
            return Ok(());
        }
        let mut t = self.ts_dec()?;
        let mut d = StrDec::new(self.cols[1 + self.n_doubles + col], self.rows);
        for _ in 0..self.rows {
            let ts = t.next()?;
            f(ts, d.next()?.0);
        }
        d.finish()?;
        t.finish(self)
    }

    /// Every row: f(ts, doubles, strings).
    pub fn for_each_row(&self, mut f: impl FnMut(i64, &[f64], &[String])) -> Result<(), ChunkError> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut t = self.ts_dec()?;
        let mut dd: Vec<DoubleDec<'a>> = self.cols[1..1 + self.n_doubles]
            .iter()
            .map(|c| DoubleDec::new(c))
            .collect();
        let mut sd: Vec<StrDec<'a>> = self.cols[1 + self.n_doubles..]
            .iter()
            .map(|c| StrDec::new(c, self.rows))
            .collect();
        let mut dv = vec![0.0; self.n_doubles];
        let mut sv = vec![String::new(); self.n_strings];
        for _ in 0..self.rows {
            let ts = t.next()?;
            for (d, v) in dd.iter_mut().zip(dv.iter_mut()) {
                *v = d.next()?;
            }
            for (d, v) in sd.iter_mut().zip(sv.iter_mut()) {
                let (s, changed) = d.next()?;
                if changed {
                    v.clear();
                    v.push_str(s);
                }
            }
            f(ts, &dv, &sv);
        }
        for d in &dd {
            d.finish()?;
        }
        for d in &sd {
            d.finish()?;
        }
        t.finish(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    type Row = (i64, Vec<f64>, Vec<String>);

    const T0: i64 = 1_750_000_000_000_000_000;
    const SEC: i64 = 1_000_000_000;

    fn specials() -> Vec<f64> {
        vec![
            f64::NAN,
            -f64::NAN,
            f64::from_bits(0x7ff0_0000_0000_0001), // signalling NaN, tiny payload
            f64::from_bits(0xfff8_dead_beef_0001),
            f64::from_bits(0x7fff_ffff_ffff_ffff),
            0.0,
            -0.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            5e-324,
            -5e-324,
            f64::from_bits(0x000f_ffff_ffff_ffff), // largest subnormal
            f64::MAX,
            f64::MIN,
            f64::EPSILON,
            1.0,
            -1.0,
            0.1,
            0.57,
            -12.5,
            1e300,
            -1e-300,
            9_007_199_254_740_992.0,
            9_007_199_254_740_994.0,
            1e22,
            123_456_789.123,
            0.000_000_1,
            0.000_000_01,
        ]
    }

    fn random_double(rng: &mut StdRng, prev: f64, style: u32) -> f64 {
        let walk = |rng: &mut StdRng, scale: f64| {
            let base = if prev.is_finite() && prev.abs() < 1e12 {
                prev
            } else {
                1.0
            };
            ((base + rng.random_range(-5.0..5.0) / scale) * scale).round() / scale
        };
        match style {
            // a decimal gauge with the odd special value
            0 => match rng.random_range(0..40) {
                0 => specials()[rng.random_range(0..specials().len())],
                1..=15 => prev,
                _ => walk(rng, 100.0),
            },
            // constant
            1 => prev,
            // anything
            _ => match rng.random_range(0..10) {
                0 | 1 => specials()[rng.random_range(0..specials().len())],
                2 => prev,
                3 => f64::from_bits(rng.random()),
                4 => {
                    let scale = 10f64.powi(rng.random_range(0..9));
                    walk(rng, scale)
                }
                5 => rng.random_range(-1e6..1e6),
                6 => rng.random_range(-1_000_000_000_000i64..1_000_000_000_000) as f64,
                7 => f64::from_bits(prev.to_bits() ^ (1 << rng.random_range(0..64))),
                8 => rng.random::<f64>(),
                _ => walk(rng, 1.0),
            },
        }
    }

    fn random_ts(rng: &mut StdRng, prev: i64, style: u32) -> i64 {
        match style {
            0 => prev.wrapping_add(SEC + rng.random_range(-1_000_000..1_000_000)),
            1 => prev.wrapping_add(SEC),
            _ => match rng.random_range(0..14) {
                0 => prev,
                1 => prev.wrapping_sub(rng.random_range(0..10 * SEC)),
                2 => i64::MIN,
                3 => i64::MAX,
                4 => rng.random(),
                5 => prev.wrapping_add(1),
                6 => prev.wrapping_add(rng.random_range(0..1 << 40)),
                7 => prev.wrapping_sub(1),
                _ => prev.wrapping_add(SEC + rng.random_range(0..1_000_000)),
            },
        }
    }

    fn random_string(rng: &mut StdRng, prev: &str) -> String {
        match rng.random_range(0..10) {
            0..=3 => prev.to_string(),
            4 => String::new(),
            5 => "héllo wörld ✓ 日本".to_string(),
            6 => (0..rng.random_range(0..40))
                .map(|_| rng.random_range('a'..='z'))
                .collect(),
            7 => "x".repeat(rng.random_range(100..300)),
            _ => ["ok", "warn", "crit"][rng.random_range(0..3)].to_string(),
        }
    }

    fn random_rows(rng: &mut StdRng, n: usize, nd: usize, ns: usize) -> Vec<Row> {
        let ts_style = rng.random_range(0..3);
        let d_styles: Vec<u32> = (0..nd).map(|_| rng.random_range(0..3)).collect();
        let mut ts = match rng.random_range(0..4) {
            0 => i64::MIN,
            1 => i64::MAX,
            2 => rng.random(),
            _ => T0,
        };
        let mut prev_d: Vec<f64> = (0..nd).map(|_| random_double(rng, 0.5, 2)).collect();
        let mut prev_s: Vec<String> = vec![String::new(); ns];
        let mut rows = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 {
                ts = random_ts(rng, ts, ts_style);
            }
            for (p, &st) in prev_d.iter_mut().zip(&d_styles) {
                *p = random_double(rng, *p, st);
            }
            for p in prev_s.iter_mut() {
                *p = random_string(rng, p);
            }
            rows.push((ts, prev_d.clone(), prev_s.clone()));
        }
        rows
    }

    fn write(rows: &[Row], nd: usize, ns: usize) -> ChunkWriter {
        let mut w = ChunkWriter::new(nd, ns);
        for (ts, d, s) in rows {
            let s: Vec<&str> = s.iter().map(String::as_str).collect();
            w.push(*ts, d, &s).unwrap();
        }
        w
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Decodes `bytes` every way and checks it equals `rows`.
    fn check(bytes: &[u8], rows: &[Row], nd: usize, ns: usize) {
        let r = ChunkReader::new(bytes).unwrap();
        assert_eq!((r.rows(), r.n_doubles(), r.n_strings()), (rows.len(), nd, ns));
        let ts: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(r.timestamps().unwrap(), ts);
        if let (Some(first), Some(last)) = (ts.first(), ts.last()) {
            assert_eq!((r.first_ts(), r.last_ts()), (*first, *last));
            assert_eq!(r.min_ts(), *ts.iter().min().unwrap());
            assert_eq!(r.max_ts(), *ts.iter().max().unwrap());
        }
        let mut i = 0;
        r.for_each_row(|t, d, s| {
            let (et, ed, es) = &rows[i];
            assert_eq!(t, *et, "row {i}");
            assert_eq!(bits(d), bits(ed), "row {i}");
            assert_eq!(s, &es[..], "row {i}");
            i += 1;
        })
        .unwrap();
        assert_eq!(i, rows.len());
        for c in 0..nd {
            let mut got = Vec::new();
            r.for_each_double(c, |t, v| got.push((t, v.to_bits()))).unwrap();
            let want: Vec<(i64, u64)> = rows.iter().map(|r| (r.0, r.1[c].to_bits())).collect();
            assert_eq!(got, want, "double column {c}");
        }
        for c in 0..ns {
            let mut got = Vec::new();
            r.for_each_string(c, |t, v| got.push((t, v.to_string()))).unwrap();
            let want: Vec<(i64, String)> = rows.iter().map(|r| (r.0, r.2[c].clone())).collect();
            assert_eq!(got, want, "string column {c}");
        }
        assert!(matches!(
            r.for_each_double(nd, |_, _| {}),
            Err(ChunkError::Shape(_))
        ));
        assert!(matches!(
            r.for_each_string(ns, |_, _| {}),
            Err(ChunkError::Shape(_))
        ));
    }

    #[test]
    fn chunk_round_trips_random_rows() {
        let mut rng = StdRng::seed_from_u64(0x5eed_c0de);
        for case in 0..400 {
            let (nd, ns) = (rng.random_range(0..5), rng.random_range(0..3));
            let n = match case % 4 {
                0 => rng.random_range(0..4),
                1 | 2 => rng.random_range(0..200),
                _ => rng.random_range(200..1500),
            };
            let rows = random_rows(&mut rng, n, nd, ns);
            let mid = rng.random_range(0..=n);
            let mut w = write(&rows[..mid], nd, ns);
            let bytes = w.encode();
            assert_eq!(bytes.len(), w.encoded_len());
            check(&bytes, &rows[..mid], nd, ns);
            assert_eq!(w.rows(), mid);
            assert_eq!(w.is_empty(), mid == 0);
            for (ts, d, s) in &rows[mid..] {
                let s: Vec<&str> = s.iter().map(String::as_str).collect();
                w.push(*ts, d, &s).unwrap();
            }
            let bytes = w.encode();
            assert_eq!(bytes.len(), w.encoded_len());
            check(&bytes, &rows, nd, ns);
            let ts: Vec<i64> = rows.iter().map(|r| r.0).collect();
            assert_eq!(w.first_ts(), ts.first().copied());
            assert_eq!(w.last_ts(), ts.last().copied());
            assert_eq!(w.min_ts(), ts.iter().min().copied());
            assert_eq!(w.max_ts(), ts.iter().max().copied());
        }
    }

    #[test]
    fn chunk_round_trips_every_special_double_after_every_other() {
        let sp = specials();
        let mut rows = Vec::new();
        let mut ts = T0;
        for a in &sp {
            for b in &sp {
                rows.push((ts, vec![*a, *b, *a], vec![]));
                ts += SEC;
            }
        }
        check(&write(&rows, 3, 0).encode(), &rows, 3, 0);
        // extreme timestamps, one column each coding
        let ts = [
            i64::MIN,
            i64::MAX,
            i64::MIN,
            0,
            -1,
            i64::MAX,
            i64::MAX,
            i64::MIN + 1,
            5,
            5,
            4,
        ];
        let rows: Vec<Row> = ts
            .iter()
            .map(|&t| (t, vec![0.25, f64::from_bits(t as u64)], vec![]))
            .collect();
        check(&write(&rows, 2, 0).encode(), &rows, 2, 0);
    }

    #[test]
    fn chunk_picks_the_smaller_double_coding() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut g = 0.5f64;
        let mut rows = Vec::new();
        for i in 0..1000 {
            g = ((g + rng.random_range(-0.05..0.05)) * 100.0).round() / 100.0;
            rows.push((T0 + i * SEC, vec![g, rng.random::<f64>()], vec![]));
        }
        let bytes = write(&rows, 2, 0).encode();
        let r = ChunkReader::new(&bytes).unwrap();
        assert_eq!(r.cols[1][0] >> 7, 1, "decimal gauge → decimal coding");
        assert_eq!(r.cols[2][0] >> 7, 0, "random doubles → XOR coding");
        check(&bytes, &rows, 2, 0);
    }

    /// First bits of a column.
    fn top_bits(col: &[u8], n: u32) -> u8 {
        col[0] >> (8 - n)
    }

    #[test]
    fn chunk_tunes_bucket_widths_and_keeps_escapes() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut g = 2.5f64;
        let mut rows = Vec::new();
        for i in 0..2000 {
            g = ((g + rng.random_range(-3i32..=3) as f64 / 100.0) * 100.0).round() / 100.0;
            let v = match i {
                500 => f64::NAN,
                501 => -0.0,
                900 => g + 0.001, // a third decimal: scale up
                1500 => 1.0 / 3.0,
                _ => g,
            };
            rows.push((T0 + i * SEC + rng.random_range(0..1_000_000), vec![v], vec![]));
        }
        let w = write(&rows, 1, 0);
        let bytes = w.encode();
        assert_eq!(bytes.len(), w.encoded_len());
        let r = ChunkReader::new(&bytes).unwrap();
        assert_eq!(top_bits(r.cols[0], 1), 1, "timestamps: tuned widths");
        assert_eq!(top_bits(r.cols[1], 2), 0b11, "decimal coding with tuned widths");
        check(&bytes, &rows, 1, 0);
        // short chunks keep the default tables
        let w = write(&rows[..3], 1, 0);
        let bytes = w.encode();
        let r = ChunkReader::new(&bytes).unwrap();
        assert_eq!(top_bits(r.cols[0], 1), 0);
        assert_eq!(top_bits(r.cols[1], 2), 0b10);
        check(&bytes, &rows[..3], 1, 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn chunk_bucket_widths_are_optimal(
            lengths in prop::collection::vec((1..=64usize, 1..1000u32), 1..7),
        ) {
            let mut hist = [0u32; 65];
            for (l, n) in lengths {
                hist[l] += n;
            }
            let (c, opt) = TS_CODES.optimize(&hist);
            prop_assert_eq!(c.cost_of(&hist) + 24, opt, "{:?}", c);
            // brute force over every width tuple drawn from the lengths present
            let mut ls: Vec<u32> = (1..=64).filter(|&l| hist[l as usize] > 0).collect();
            ls.push(64);
            let mut best = u64::MAX;
            for &a in &ls {
                for &b in ls.iter().filter(|&&b| b >= a) {
                    for &cc in ls.iter().filter(|&&cc| cc >= b) {
                        for &d in ls.iter().filter(|&&d| d >= cc) {
                            let t = Codes {
                                w: [a, b, cc, d, 64, 0],
                                ..TS_CODES
                            };
                            best = best.min(t.cost_of(&hist));
                        }
                    }
                }
            }
            prop_assert_eq!(best + 24, opt);
        }
    }

    #[test]
    fn chunk_shape_errors_leave_the_writer_unchanged() {
        let mut w = ChunkWriter::new(2, 1);
        assert!(w.is_empty());
        assert_eq!(
            (w.first_ts(), w.last_ts(), w.min_ts(), w.max_ts()),
            (None, None, None, None)
        );
        let empty = w.encode();
        assert_eq!(empty.len(), w.encoded_len());
        check(&empty, &[], 2, 1);
        assert!(matches!(w.push(1, &[1.0], &["a"]), Err(ChunkError::Shape(_))));
        assert!(matches!(w.push(1, &[1.0, 2.0], &[]), Err(ChunkError::Shape(_))));
        assert!(w.is_empty());
        w.push(3, &[1.0, 2.0], &["a"]).unwrap();
        w.push(1, &[1.0, 2.0], &["a"]).unwrap();
        assert_eq!(
            (w.first_ts(), w.last_ts(), w.min_ts(), w.max_ts()),
            (Some(3), Some(1), Some(1), Some(3))
        );
        let rows = vec![
            (3, vec![1.0, 2.0], vec!["a".to_string()]),
            (1, vec![1.0, 2.0], vec!["a".to_string()]),
        ];
        check(&w.encode(), &rows, 2, 1);
    }

    /// Runs every accessor; returns whether all succeeded. Must never panic.
    fn decode_everything(bytes: &[u8]) -> bool {
        let Ok(r) = ChunkReader::new(bytes) else {
            return false;
        };
        let mut ok = true;
        match r.timestamps() {
            Ok(ts) => assert_eq!(ts.len(), r.rows()),
            Err(_) => ok = false,
        }
        let mut n = 0;
        ok &= r
            .for_each_row(|_, d, s| {
                assert_eq!((d.len(), s.len()), (r.n_doubles(), r.n_strings()));
                n += 1;
            })
            .is_ok();
        for c in 0..r.n_doubles() {
            ok &= r.for_each_double(c, |_, _| {}).is_ok();
        }
        for c in 0..r.n_strings() {
            ok &= r.for_each_string(c, |_, _| {}).is_ok();
        }
        ok
    }

    fn sample_chunks() -> Vec<Vec<u8>> {
        let mut rng = StdRng::seed_from_u64(99);
        let mut out = Vec::new();
        for (n, nd, ns) in [
            (150, 3, 2),
            (60, 1, 0),
            (1, 2, 1),
            (2, 0, 1),
            (100, 0, 0),
            (300, 2, 0),
        ] {
            let rows = random_rows(&mut rng, n, nd, ns);
            out.push(write(&rows, nd, ns).encode());
        }
        out
    }

    #[test]
    fn chunk_every_truncation_is_an_error() {
        for bytes in sample_chunks() {
            assert!(decode_everything(&bytes));
            for i in 0..bytes.len() {
                assert!(
                    !decode_everything(&bytes[..i]),
                    "prefix of {i} of {} bytes",
                    bytes.len()
                );
            }
        }
    }

    #[test]
    fn chunk_byte_flips_and_garbage_never_panic() {
        let chunks = sample_chunks();
        let valid = std::cell::Cell::new(0usize);
        // One of the sample chunks with 1 to 3 bytes flipped (position, non-zero xor).
        let flips = (
            any::<prop::sample::Index>(),
            prop::collection::vec((any::<prop::sample::Index>(), 1..=255u8), 1..4),
        );
        proptest!(ProptestConfig::with_cases(30_000), |((which, flips) in flips)| {
            let mut b = which.get(&chunks).clone();
            for (at, x) in flips {
                let at = at.index(b.len());
                b[at] ^= x;
            }
            valid.set(valid.get() + usize::from(decode_everything(&b)));
        });
        // Garbage after the magic byte.
        proptest!(ProptestConfig::with_cases(20_000), |(mut b in prop::collection::vec(any::<u8>(), 0..64))| {
            if let Some(x) = b.first_mut() {
                *x = MAGIC;
            }
            decode_everything(&b);
        });
        eprintln!("byte flips: {} of 30000 still decode", valid.get());
    }

    #[test]
    fn chunk_huge_row_counts_fail_fast() {
        for (rows, nd, ns) in [
            (u32::MAX as u64, 1, 1),
            (u32::MAX as u64, 0, 0),
            (1 << 40, 0, 0),
            (1000, 0, 0),
        ] {
            let mut b = vec![MAGIC];
            for v in [rows, nd, ns] {
                put_varint(&mut b, v);
            }
            b.extend_from_slice(&0i64.to_le_bytes());
            b.extend_from_slice(&[0, 0, 0]);
            for _ in 0..1 + nd + ns {
                put_varint(&mut b, 4);
            }
            b.extend(std::iter::repeat_n(0, 4 * (1 + nd + ns) as usize));
            assert!(
                matches!(ChunkReader::new(&b), Err(ChunkError::Corrupt(_))),
                "{rows} rows"
            );
        }
        // a header claiming a billion columns
        let mut b = vec![MAGIC, 1];
        put_varint(&mut b, 1 << 30);
        put_varint(&mut b, 1 << 30);
        b.extend_from_slice(&[0; 11]);
        assert!(matches!(ChunkReader::new(&b), Err(ChunkError::Corrupt(_))));
        assert!(ChunkReader::new(&[]).is_err());
        assert!(ChunkReader::new(&[0]).is_err());
    }

    /// A load-like gauge: 2 decimals, random walk, `steps` hundredths at most per sample.
    fn gauge_rows(rng: &mut StdRng, n: usize, nd: usize, jitter: i64, constant: bool) -> Vec<Row> {
        let mut v: Vec<f64> = (0..nd).map(|i| 0.5 + i as f64).collect();
        (0..n as i64)
            .map(|i| {
                if !constant {
                    for x in v.iter_mut() {
                        let step = rng.random_range(-3i32..=3) as f64 / 100.0;
                        *x = ((*x + step).max(0.0) * 100.0).round() / 100.0;
                    }
                }
                let j = if jitter > 0 {
                    rng.random_range(0..jitter)
                } else {
                    0
                };
                (T0 + i * SEC + j, v.clone(), vec![])
            })
            .collect()
    }

    fn xor_only_bytes(rows: &[Row], nd: usize) -> usize {
        (0..nd)
            .map(|c| {
                let mut e = XorEnc::new();
                rows.iter().for_each(|r| e.push(r.1[c]));
                e.bits.bytes()
            })
            .sum()
    }

    #[test]
    fn chunk_bytes_per_value_of_a_gauge() {
        let mut rng = StdRng::seed_from_u64(42);
        let (n, nd) = (3600, 3);
        for (name, jitter, constant) in [
            (
                "gauge, 1 s ± ≤1 ms ns jitter, 2 decimals random walk",
                1_000_000,
                false,
            ),
            ("gauge, exact 1 s, 2 decimals random walk", 0, false),
            ("constant values, 1 s ± ≤1 ms ns jitter", 1_000_000, true),
            ("constant values, exact 1 s", 0, true),
        ] {
            let rows = gauge_rows(&mut rng, n, nd, jitter, constant);
            let w = write(&rows, nd, 0);
            let bytes = w.encode();
            check(&bytes, &rows, nd, 0);
            let r = ChunkReader::new(&bytes).unwrap();
            let ts_bits = r.cols[0].len() as f64 * 8.0 / n as f64;
            let val_bits = r.cols[1..].iter().map(|c| c.len()).sum::<usize>() as f64 * 8.0 / (n * nd) as f64;
            let per_value = bytes.len() as f64 / (n * nd) as f64;
            let per_cell = bytes.len() as f64 / (n * (nd + 1)) as f64;
            eprintln!(
                "{name}: {n} rows x {nd} doubles = {} bytes: {per_value:.3} B/value (timestamps \
                 amortized), {per_cell:.3} B per row x (ts + doubles); timestamps {ts_bits:.2} \
                 bits/row, doubles {val_bits:.2} bits/value; XOR-only doubles would take {:.2} \
                 bits/value",
                bytes.len(),
                xor_only_bytes(&rows, nd) as f64 * 8.0 / (n * nd) as f64,
            );
            assert!(per_value < 16.0);
        }
    }

    fn time_decode(name: &str, rows: &[Row], nd: usize) {
        let bytes = write(rows, nd, 0).encode();
        let r = ChunkReader::new(&bytes).unwrap();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let (mut n, mut sum) = (0usize, 0f64);
            r.for_each_double(0, |ts, v| {
                n += 1;
                sum += v + (ts & 1) as f64;
            })
            .unwrap();
            let dt = t.elapsed().as_secs_f64();
            assert_eq!(n, rows.len());
            std::hint::black_box(sum);
            best = best.min(dt);
        }
        eprintln!(
            "{name}: decoded {} values of one column (+ timestamps) in {:.1} ms = {:.1} ns/value \
             ({} bytes)",
            rows.len(),
            best * 1e3,
            best * 1e9 / rows.len() as f64,
            bytes.len()
        );
    }

    #[test]
    #[ignore]
    fn chunk_decode_speed_one_million_values() {
        let mut rng = StdRng::seed_from_u64(3);
        let n = 1_000_000;
        let rows = gauge_rows(&mut rng, n, 3, 1_000_000, false);
        time_decode("decimal gauge, 3 columns", &rows, 3);
        let rows: Vec<Row> = (0..n as i64)
            .map(|i| {
                (
                    T0 + i * SEC + rng.random_range(0..1_000_000),
                    vec![rng.random::<f64>() * 100.0],
                    vec![],
                )
            })
            .collect();
        time_decode("random doubles (XOR coding)", &rows, 1);
        // The store's way: chunks of 1024 rows.
        let rows = gauge_rows(&mut rng, n, 3, 1_000_000, false);
        let chunks: Vec<Vec<u8>> = rows.chunks(1024).map(|c| write(c, 3, 0).encode()).collect();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            let (mut k, mut sum) = (0usize, 0f64);
            for c in &chunks {
                ChunkReader::new(c)
                    .unwrap()
                    .for_each_double(1, |ts, v| {
                        k += 1;
                        sum += v + (ts & 1) as f64;
                    })
                    .unwrap();
            }
            assert_eq!(k, n);
            std::hint::black_box(sum);
            best = best.min(t.elapsed().as_secs_f64());
        }
        eprintln!(
            "decimal gauge in {} chunks of 1024 rows: {n} values of one column in {:.1} ms",
            chunks.len(),
            best * 1e3
        );
    }
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    /// Rows like a simulated host's: `n` decimal gauges with 2 digits, 1 s apart with jitter.
    fn host_rows(n: usize, rows: usize, mut at: impl FnMut(usize, &ChunkWriter)) -> ChunkWriter {
        let mut w = ChunkWriter::new(n, 0);
        let mut levels = vec![10.0f64; n];
        for row in 0..rows {
            for (i, l) in levels.iter_mut().enumerate() {
                let step = ((row * 7 + i * 13) % 11) as f64 - 5.0;
                *l = ((*l + step * 0.01) * 100.0).round() / 100.0;
            }
            let ts =
                1_700_000_000_000_000_000 + row as i64 * 1_000_000_000 + ((row * 7919) % 1000) as i64 * 1000;
            w.push(ts, &levels, &[]).unwrap();
            at(row + 1, &w);
        }
        w
    }

    /// What an open chunk holds on the heap is a fixed part per column plus its bit streams:
    /// the figures docs/archiver.md gives per stream ("Memory, term by term").
    #[test]
    fn open_chunk_memory_is_bounded_per_column_and_row() {
        let empty = ChunkWriter::new(12, 0).heap_bytes();
        let mut seen = Vec::new();
        host_rows(12, 1024, |rows, w| {
            if [15, 135, 1024].contains(&rows) {
                seen.push((rows, w.heap_bytes(), w.encoded_len()));
            }
        });
        println!(
            "DoubleEnc {} B; 12 doubles: empty {empty} B; (rows, heap bytes, encoded bytes) {seen:?}",
            std::mem::size_of::<DoubleEnc>()
        );
        // Fixed: at most 320 bytes per double column (both codings' state, 240 bytes, and
        // their first words).
        assert!(std::mem::size_of::<DoubleEnc>() <= 240);
        assert!(empty <= 12 * 320, "empty writer {empty} B");
        for (rows, heap, encoded) in seen {
            // Both codings kept, each bit stream grown by doubling: at most 4x the encoded
            // bytes on top of the fixed part.
            assert!(
                heap <= 12 * 320 + 4 * encoded,
                "{rows} rows: {heap} B (encoded {encoded} B)"
            );
        }
    }

    /// A column with more than 65,535 values of one bit length (its 16-bit histogram full)
    /// keeps the default buckets and still decodes exactly.
    #[test]
    fn a_full_histogram_keeps_the_default_buckets_and_decodes() {
        let rows = 70_000;
        let mut w = ChunkWriter::new(1, 0);
        for r in 0..rows {
            // Regular timestamps (delta-of-delta 0) and a constant step (the same delta).
            w.push(1_000 + r as i64 * 10, &[r as f64 * 0.5], &[]).unwrap();
        }
        assert!(w.ts.hist.full);
        let bytes = w.encode();
        assert_eq!(bytes.len(), w.encoded_len());
        let rd = ChunkReader::new(&bytes).unwrap();
        let ts = rd.timestamps().unwrap();
        assert_eq!(ts.len(), rows);
        assert!(ts.iter().enumerate().all(|(r, &t)| t == 1_000 + r as i64 * 10));
        let mut n = 0;
        rd.for_each_double(0, |t, v| {
            assert_eq!(v, ((t - 1_000) / 10) as f64 * 0.5);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, rows);
    }
}
