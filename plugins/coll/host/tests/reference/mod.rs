//! What both collective tests share: element sizes and codecs, the sequential reduction the
//! results are checked against, the sentinel bytes outside each range, and an out-of-band barrier.
#![allow(dead_code)]

use std::time::Duration;

use half::{bf16, f16};
use urom_coll::{Datatype, ReduceOp};
use urom_host::oob::{OobCollective, SocketOob};

/// An element's size in bytes.
pub fn es(dt: Datatype) -> usize {
    dt.size().unwrap()
}

/// `bits` cut to the element's width.
pub fn mask(dt: Datatype, bits: u64) -> u64 {
    match es(dt) {
        8 => bits,
        n => bits & ((1u64 << (8 * n)) - 1),
    }
}

/// `bits` read as a signed element.
pub fn signed(dt: Datatype, bits: u64) -> i128 {
    let width = 8 * es(dt) as u32;
    let shift = 128 - width;
    (i128::from(bits) << shift) >> shift
}

/// `a op b` for one element, as the sequential reference computes it.
pub fn fold(dt: Datatype, op: ReduceOp, a: u64, b: u64) -> u64 {
    let int = |x: u64| -> i128 {
        match dt {
            Datatype::I8 | Datatype::I16 | Datatype::I32 | Datatype::I64 => signed(dt, x),
            _ => i128::from(x),
        }
    };
    let back = |v: i128| mask(dt, v as u64);
    macro_rules! float {
        ($from:expr, $to:expr) => {{
            let (x, y) = ($from(a), $from(b));
            let v = match op {
                ReduceOp::Sum => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
                _ => unreachable!(),
            };
            $to(v)
        }};
    }
    match dt {
        Datatype::F32 => float!(|v| f32::from_bits(v as u32), |v: f32| u64::from(
            v.to_bits()
        )),
        Datatype::F64 => float!(f64::from_bits, |v: f64| v.to_bits()),
        Datatype::F16 => float!(|v| f16::from_bits(v as u16).to_f32(), |v: f32| u64::from(
            f16::from_f32(v).to_bits()
        )),
        Datatype::Bf16 => float!(|v| bf16::from_bits(v as u16).to_f32(), |v: f32| u64::from(
            bf16::from_f32(v).to_bits()
        )),
        _ => {
            let (x, y) = (int(a), int(b));
            match op {
                ReduceOp::Sum => back(x.wrapping_add(y)),
                ReduceOp::Prod => back(x.wrapping_mul(y)),
                ReduceOp::Min => back(x.min(y)),
                ReduceOp::Max => back(x.max(y)),
                ReduceOp::Band => a & b,
                ReduceOp::Bor => a | b,
                ReduceOp::Bxor => a ^ b,
                ReduceOp::Land => u64::from(a != 0 && b != 0),
                ReduceOp::Lor => u64::from(a != 0 || b != 0),
                ReduceOp::Lxor => u64::from((a != 0) ^ (b != 0)),
                ReduceOp::Unknown(_) => unreachable!(),
            }
        }
    }
}

/// Writes element `at` of `bytes`.
pub fn put(bytes: &mut [u8], dt: Datatype, at: u64, bits: u64) {
    let e = es(dt);
    let at = at as usize * e;
    bytes[at..at + e].copy_from_slice(&bits.to_le_bytes()[..e]);
}

/// Reads element `at` of `bytes`.
pub fn get(bytes: &[u8], dt: Datatype, at: u64) -> u64 {
    let e = es(dt);
    let at = at as usize * e;
    let mut word = [0u8; 8];
    word[..e].copy_from_slice(&bytes[at..at + e]);
    u64::from_le_bytes(word)
}

/// What every byte outside a collective's ranges holds, before and after.
pub const SENTINEL: u8 = 0xa5;

/// v-variant counts: zero and uneven.
pub fn vcount(i: u32, j: u32, c: u64) -> u64 {
    (u64::from(i) * 3 + u64::from(j) + c) % 4
}

/// Every rank of the out-of-band group here before any goes on.
pub fn oob_barrier(oob: &mut SocketOob) {
    let mut request = oob.allgather(&[0]).unwrap();
    while !oob.test(&mut request).unwrap() {
        std::thread::sleep(Duration::from_micros(100));
    }
    oob.free(request);
}
