//! What both collective tests share: element sizes and codecs, the sequential reduction the
//! results are checked against, the sentinel bytes outside each range, an out-of-band barrier,
//! and one case of a collective set up, run and checked element by element.
#![allow(dead_code)]

use std::time::Duration;

use half::{bf16, f16};
use urom_coll::{Buffer, CollKind, CollSpec, Collective, Datatype, ReduceOp, Team};
use urom_host::ProgressEngine;
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

// ---- One collective's case, run and checked.

/// One collective to run: its kind, datatype, operation, count and root, in place or not, in
/// user memory (registered by address) or shared memory.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub kind: CollKind,
    pub dt: Datatype,
    pub op: ReduceOp,
    pub count: u64,
    pub root: u32,
    pub in_place: bool,
    pub user: bool,
}

/// The cases' send and receive buffers, in shared and in user memory.
pub struct Buffers {
    pub shared_send: Buffer,
    pub shared_recv: Buffer,
    pub user_send: Buffer,
    pub user_recv: Buffer,
}

/// Runs `case` on rank `me` of the `n` ranks of `team` (each rank calls it with the same case)
/// and checks this rank's result against the sequential reference: `elem` is element `i` of
/// rank `r`'s data, `reduced` element `i` of every rank's data reduced in the test's order.
#[allow(clippy::too_many_arguments)]
pub fn run_case(
    team: &Team,
    engine: &mut ProgressEngine,
    buffers: &mut Buffers,
    case: Case,
    n: u32,
    me: u32,
    elem: fn(Datatype, u32, u64) -> u64,
    reduced: &dyn Fn(Datatype, ReduceOp, u64) -> u64,
) {
    let (dt, c) = (case.dt, case.count);
    let nu = u64::from(n);
    let (send, recv) = if case.user {
        (&mut buffers.user_send, &mut buffers.user_recv)
    } else {
        (&mut buffers.shared_send, &mut buffers.shared_recv)
    };
    // In place is meaningful at the root only, for rooted collectives.
    let rooted = matches!(
        case.kind,
        CollKind::Reduce | CollKind::Gather | CollKind::Scatter
    );
    let ip = case.in_place && !(rooted && me != case.root);
    // The v-variants' words.
    let mut counts = Vec::new();
    let (mut sd, mut rd, mut gv_displs) = (Vec::new(), Vec::new(), Vec::new());
    match case.kind {
        CollKind::Allgatherv => {
            let mut at = 0;
            for s in 0..n {
                gv_displs.push(at);
                at += vcount(s, 0, c) + 1;
            }
            counts.extend((0..n).map(|s| vcount(s, 0, c)));
            counts.extend(gv_displs.iter().copied());
        }
        CollKind::Alltoallv => {
            // Send counts to each j, receive counts from each i.
            let mut at = 0;
            for j in 0..n {
                sd.push(at);
                at += vcount(me, j, c);
            }
            let mut at = 0;
            for i in 0..n {
                rd.push(at);
                at += if ip {
                    vcount(i.min(me), i.max(me), c)
                } else {
                    vcount(i, me, c)
                } + 1;
            }
            if ip {
                // In place: what goes to j and what comes from j are the same count.
                counts.extend((0..n).map(|j| vcount(me.min(j), me.max(j), c)));
                counts.extend(rd.iter().copied());
                counts.extend((0..n).map(|j| vcount(me.min(j), me.max(j), c)));
                counts.extend(rd.iter().copied());
            } else {
                counts.extend((0..n).map(|j| vcount(me, j, c)));
                counts.extend(sd.iter().copied());
                counts.extend((0..n).map(|i| vcount(i, me, c)));
                counts.extend(rd.iter().copied());
            }
        }
        _ => {}
    }
    let pair = |i: u32, j: u32| -> u64 {
        if ip {
            vcount(i.min(j), i.max(j), c)
        } else {
            vcount(i, j, c)
        }
    };
    // Fill: send with this rank's data, receive with the sentinel (or the in-place input).
    {
        let mut s = send.bytes_mut().unwrap();
        s.fill(SENTINEL);
        let mut r = recv.bytes_mut().unwrap();
        r.fill(SENTINEL);
        let input_len = match case.kind {
            CollKind::Alltoall | CollKind::ReduceScatterBlock => nu * c,
            CollKind::Scatter if me == case.root => nu * c,
            CollKind::Alltoallv => 4 * nu * 4,
            CollKind::Allgatherv => vcount(me, 0, c),
            _ => c,
        };
        for i in 0..input_len {
            put(&mut s, dt, i, elem(dt, me, i));
        }
        if ip {
            match case.kind {
                CollKind::Allreduce | CollKind::Reduce | CollKind::ReduceScatterBlock => {
                    for i in 0..input_len {
                        put(&mut r, dt, i, elem(dt, me, i));
                    }
                }
                CollKind::Allgather => {
                    for i in 0..c {
                        put(&mut r, dt, u64::from(me) * c + i, elem(dt, me, i));
                    }
                }
                CollKind::Allgatherv => {
                    for i in 0..vcount(me, 0, c) {
                        put(&mut r, dt, gv_displs[me as usize] + i, elem(dt, me, i));
                    }
                }
                CollKind::Gather => {
                    for i in 0..c {
                        put(&mut r, dt, u64::from(me) * c + i, elem(dt, me, i));
                    }
                }
                CollKind::Alltoall => {
                    for i in 0..nu * c {
                        put(&mut r, dt, i, elem(dt, me, i));
                    }
                }
                CollKind::Alltoallv => {
                    for j in 0..n {
                        for k in 0..pair(me, j) {
                            let at = rd[j as usize] + k;
                            put(&mut r, dt, at, elem(dt, me, at));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let mut spec = CollSpec::new(case.kind, dt, c);
    spec.op = case.op;
    spec.root = case.root;
    spec.counts = counts;
    spec.in_place = ip;
    if case.kind == CollKind::Bcast {
        spec.send = Some(send.whole());
    } else {
        spec.send = (!ip || case.kind == CollKind::Scatter).then(|| send.whole());
        spec.recv = Some(recv.whole());
    }
    if case.kind == CollKind::Allgatherv {
        spec.count = vcount(me, 0, c);
    }
    let mut coll: Collective = team
        .init(engine, &spec)
        .unwrap_or_else(|e| panic!("{case:?}: init: {e}"));
    coll.start()
        .unwrap_or_else(|e| panic!("{case:?}: start: {e}"))
        .wait(engine)
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    assert_eq!(coll.completions(), 1);
    drop(coll);
    // Check.
    let root = case.root;
    let s = send.bytes().unwrap();
    let r = recv.bytes().unwrap();
    let mut expect: Vec<(u64, u64)> = Vec::new(); // (index in recv, bits)
    match case.kind {
        CollKind::Barrier => {}
        CollKind::Bcast => {
            for i in 0..c {
                assert_eq!(get(&s, dt, i), elem(dt, root, i), "{case:?} at {i}");
            }
        }
        CollKind::Allreduce => expect.extend((0..c).map(|i| (i, reduced(dt, case.op, i)))),
        CollKind::Reduce if me == root => {
            expect.extend((0..c).map(|i| (i, reduced(dt, case.op, i))));
        }
        CollKind::Reduce => {}
        CollKind::ReduceScatterBlock => {
            expect.extend((0..c).map(|i| (i, reduced(dt, case.op, u64::from(me) * c + i))))
        }
        CollKind::Allgather => {
            for src in 0..n {
                expect.extend((0..c).map(|i| (u64::from(src) * c + i, elem(dt, src, i))));
            }
        }
        CollKind::Allgatherv => {
            for src in 0..n {
                let at = gv_displs[src as usize];
                expect.extend((0..vcount(src, 0, c)).map(|i| (at + i, elem(dt, src, i))));
            }
        }
        CollKind::Gather if me == root => {
            for src in 0..n {
                expect.extend((0..c).map(|i| (u64::from(src) * c + i, elem(dt, src, i))));
            }
        }
        CollKind::Gather => {}
        CollKind::Scatter => {
            if !(ip && me == root) {
                expect.extend((0..c).map(|i| (i, elem(dt, root, u64::from(me) * c + i))));
            }
        }
        CollKind::Alltoall => {
            for src in 0..n {
                expect.extend(
                    (0..c).map(|k| (u64::from(src) * c + k, elem(dt, src, u64::from(me) * c + k))),
                );
            }
        }
        CollKind::Alltoallv => {
            for src in 0..n {
                // Where `src` keeps what it sends to me: its send displacement for me, or in
                // place its receive displacement of me.
                let src_at: u64 = if ip {
                    (0..me).map(|i| pair(i, src) + 1).sum()
                } else {
                    (0..me).map(|j| vcount(src, j, c)).sum()
                };
                for k in 0..pair(src, me) {
                    expect.push((rd[src as usize] + k, elem(dt, src, src_at + k)));
                }
            }
        }
        CollKind::Unknown(_) => unreachable!(),
    }
    let window = (recv.len() / es(dt)) as u64;
    let mut expected_at = vec![None; window as usize];
    for (at, bits) in &expect {
        expected_at[*at as usize] = Some(*bits);
    }
    for at in 0..window.min(4 * nu * c.max(4) + 64) {
        match expected_at[at as usize] {
            Some(bits) => assert_eq!(
                get(&r, dt, at),
                bits,
                "{case:?}: rank {me} element {at} differs from the reference"
            ),
            None if !ip && !(case.kind == CollKind::Bcast) => assert!(
                r[at as usize * es(dt)..(at as usize + 1) * es(dt)]
                    .iter()
                    .all(|&b| b == SENTINEL),
                "{case:?}: rank {me} element {at} was written"
            ),
            None => {}
        }
    }
}
