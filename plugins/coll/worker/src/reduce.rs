//! Reduction kernels: `acc[i] = acc[i] op src[i]` over one chunk, for every datatype and
//! operation the plugin offers.
//!
//! Each kernel is a plain loop over two equally long slices of the element type, so the
//! compiler vectorises it. The engine folds ranks left to right, `((x0 op x1) op x2) ...`, and
//! every step rounds to the datatype: f16 and bf16 are widened to f32, combined, and rounded
//! back each step (for sum and product of two halves that is the correctly rounded half
//! result). Float min and max follow IEEE 754 `minNum`/`maxNum` (a NaN loses against a number),
//! as Rust's `f32::min`/`max`. Integer sum and product wrap. Logical operations give 1 or 0.

use half::{bf16, f16};
use urom_coll_wire::{Datatype, ReduceOp};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Why a reduction cannot run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceError {
    /// The operation does not apply to the datatype (or either is unknown).
    Unsupported,
    /// The chunks are not whole, aligned elements of equal length.
    Layout,
}

#[inline]
fn zip<T: Copy>(acc: &mut [T], src: &[T], f: impl Fn(T, T) -> T) {
    for (a, b) in acc.iter_mut().zip(src) {
        *a = f(*a, *b);
    }
}

fn typed<'a, T: FromBytes + IntoBytes + KnownLayout + Immutable>(
    acc: &'a mut [u8],
    src: &'a [u8],
) -> Result<(&'a mut [T], &'a [T]), ReduceError> {
    let acc = <[T]>::mut_from_bytes(acc).map_err(|_| ReduceError::Layout)?;
    let src = <[T]>::ref_from_bytes(src).map_err(|_| ReduceError::Layout)?;
    if acc.len() == src.len() {
        Ok((acc, src))
    } else {
        Err(ReduceError::Layout)
    }
}

macro_rules! int_kernel {
    ($t:ty, $op:expr, $acc:expr, $src:expr) => {{
        let (a, s) = typed::<$t>($acc, $src)?;
        match $op {
            ReduceOp::Sum => zip(a, s, <$t>::wrapping_add),
            ReduceOp::Prod => zip(a, s, <$t>::wrapping_mul),
            ReduceOp::Min => zip(a, s, |x, y| x.min(y)),
            ReduceOp::Max => zip(a, s, |x, y| x.max(y)),
            ReduceOp::Band => zip(a, s, |x, y| x & y),
            ReduceOp::Bor => zip(a, s, |x, y| x | y),
            ReduceOp::Bxor => zip(a, s, |x, y| x ^ y),
            ReduceOp::Land => zip(a, s, |x, y| <$t>::from((x != 0) & (y != 0))),
            ReduceOp::Lor => zip(a, s, |x, y| <$t>::from((x != 0) | (y != 0))),
            ReduceOp::Lxor => zip(a, s, |x, y| <$t>::from((x != 0) ^ (y != 0))),
            ReduceOp::Unknown(_) => return Err(ReduceError::Unsupported),
        }
        Ok(())
    }};
}

macro_rules! float_kernel {
    ($t:ty, $op:expr, $acc:expr, $src:expr) => {{
        let (a, s) = typed::<$t>($acc, $src)?;
        match $op {
            ReduceOp::Sum => zip(a, s, |x, y| x + y),
            ReduceOp::Prod => zip(a, s, |x, y| x * y),
            ReduceOp::Min => zip(a, s, <$t>::min),
            ReduceOp::Max => zip(a, s, <$t>::max),
            _ => return Err(ReduceError::Unsupported),
        }
        Ok(())
    }};
}

macro_rules! half_kernel {
    ($t:ty, $op:expr, $acc:expr, $src:expr) => {{
        let (a, s) = typed::<$t>($acc, $src)?;
        let f: fn(f32, f32) -> f32 = match $op {
            ReduceOp::Sum => |x, y| x + y,
            ReduceOp::Prod => |x, y| x * y,
            ReduceOp::Min => f32::min,
            ReduceOp::Max => f32::max,
            _ => return Err(ReduceError::Unsupported),
        };
        zip(a, s, |x, y| <$t>::from_f32(f(x.to_f32(), y.to_f32())));
        Ok(())
    }};
}

/// `acc = acc op src`, element by element. Both slices hold whole elements of `datatype`,
/// aligned to it, and are equally long.
pub fn reduce(
    datatype: Datatype,
    op: ReduceOp,
    acc: &mut [u8],
    src: &[u8],
) -> Result<(), ReduceError> {
    if !op.applies_to(datatype) {
        return Err(ReduceError::Unsupported);
    }
    match datatype {
        Datatype::I8 => int_kernel!(i8, op, acc, src),
        Datatype::I16 => int_kernel!(i16, op, acc, src),
        Datatype::I32 => int_kernel!(i32, op, acc, src),
        Datatype::I64 => int_kernel!(i64, op, acc, src),
        Datatype::U8 => int_kernel!(u8, op, acc, src),
        Datatype::U16 => int_kernel!(u16, op, acc, src),
        Datatype::U32 => int_kernel!(u32, op, acc, src),
        Datatype::U64 => int_kernel!(u64, op, acc, src),
        Datatype::F32 => float_kernel!(f32, op, acc, src),
        Datatype::F64 => float_kernel!(f64, op, acc, src),
        Datatype::F16 => half_kernel!(f16, op, acc, src),
        Datatype::Bf16 => half_kernel!(bf16, op, acc, src),
        Datatype::Unknown(_) => Err(ReduceError::Unsupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_ops_wrap_and_logical_ops_give_one_or_zero() {
        let mut acc = [250u8, 0, 3, 7];
        reduce(Datatype::U8, ReduceOp::Sum, &mut acc, &[10, 0, 4, 1]).unwrap();
        assert_eq!(acc, [4, 0, 7, 8]);
        let mut acc = [2u8, 0, 3, 0];
        reduce(Datatype::U8, ReduceOp::Land, &mut acc, &[5, 1, 0, 0]).unwrap();
        assert_eq!(acc, [1, 0, 0, 0]);
        let mut acc = [2u8, 0, 3, 0];
        reduce(Datatype::U8, ReduceOp::Lxor, &mut acc, &[5, 1, 0, 0]).unwrap();
        assert_eq!(acc, [0, 1, 1, 0]);
    }

    #[test]
    fn float_bitwise_ops_are_refused() {
        let mut acc = [0u8; 8];
        assert_eq!(
            reduce(Datatype::F32, ReduceOp::Bxor, &mut acc, &[0; 8]),
            Err(ReduceError::Unsupported)
        );
        assert_eq!(
            reduce(Datatype::Bf16, ReduceOp::Land, &mut acc, &[0; 8]),
            Err(ReduceError::Unsupported)
        );
    }

    #[test]
    fn halves_round_each_step() {
        let a = f16::from_f32(1.0);
        let b = f16::from_f32(0.0004);
        let mut acc = [0u8; 2];
        acc.copy_from_slice(&a.to_le_bytes());
        reduce(Datatype::F16, ReduceOp::Sum, &mut acc, &b.to_le_bytes()).unwrap();
        assert_eq!(
            f16::from_le_bytes(acc),
            f16::from_f32(a.to_f32() + b.to_f32())
        );
    }
}
