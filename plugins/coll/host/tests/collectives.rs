//! The collective offload end to end: a real daemon offering `worker_coll`, and 2, 3, 4 or 8
//! ranks as real processes (this test binary started again, running `rank_entry` only), which
//! share one worker, form teams, register buffers and run collectives checked against a
//! sequential reference computed here.
//!
//! Reference rules: integers exact (sum and product wrap); floats folded in rank order, each
//! step rounded to the datatype (f16 and bf16 through f32), compared bit for bit.

use std::path::Path;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use urom_coll::{
    CollError, CollHost, CollKind, CollSpec, Datatype, Reason, ReduceOp, SetupError, Team,
    node_worker,
};
use urom_host::oob::{RendezvousAddr, SocketOob};
use urom_host::{Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::TempDir;
use urom_wire::Status;

mod reference;
use reference::*;

#[global_allocator]
static ALLOCATOR: urom_testkit::counting::Counting = urom_testkit::counting::Counting;

const ROLE: &str = "UROM_COLL_TEST_ROLE";

// ---------------------------------------------------------------------------------------------
// The parent side: a daemon and the rank processes.

struct Run {
    _plugins: TempDir,
    daemon: urom_testkit::daemon::Daemon,
    dir: TempDir,
}

fn daemon() -> Run {
    let plugins = TempDir::new("urom-coll-plugins");
    let dir = urom_testkit::daemon::plugin_dir(&plugins, &[("urom-plugin-coll", "worker_coll")]);
    let daemon = urom_testkit::daemon::start_daemon(
        urom_testkit::binary("urom-daemon", "urom-daemon"),
        dir.to_str().expect("a UTF-8 path"),
        &[],
        true,
    );
    Run {
        _plugins: plugins,
        daemon,
        dir: TempDir::new("urom-coll-run"),
    }
}

/// Runs `scenario` on `size` rank processes; panics with their output unless all succeed.
fn ranks(scenario: &str, size: u32) {
    let run = daemon();
    let exe = std::env::current_exe().expect("the test binary");
    let mut children = Vec::new();
    for rank in 0..size {
        let child = Command::new(&exe)
            .args(["--exact", "rank_entry", "--nocapture", "--test-threads=1"])
            .env(
                ROLE,
                format!(
                    "{scenario},{rank},{size},{},{}",
                    run.daemon.socket.display(),
                    run.dir.path().display()
                ),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting a rank");
        children.push(child);
    }
    // A safety net against a hang, far beyond any run's time; not a performance bound.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        loop {
            if child.try_wait().expect("waiting for a rank").is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("a rank's output");
        let text = format!(
            "rank {rank} ({}):\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let passed = out.status.success()
            && String::from_utf8_lossy(&out.stdout).contains("rank scenario done");
        if !passed {
            failed.push(text);
        }
    }
    assert!(
        failed.is_empty(),
        "{scenario} on {size} ranks failed:\n{}\ndaemon log:\n{}",
        failed.join("\n"),
        run.daemon.log()
    );
}

#[test]
fn every_collective_datatype_and_operation_on_three_ranks() {
    ranks("matrix", 3);
}

#[test]
fn collectives_on_two_ranks_with_user_memory_and_a_malformed_command() {
    ranks("quick", 2);
}

#[test]
fn collectives_on_four_ranks_and_sub_teams() {
    ranks("subteams", 4);
}

#[test]
fn collectives_on_eight_oversubscribed_ranks() {
    ranks("quick", 8);
}

#[test]
fn a_thousand_restarts_allocate_nothing_and_several_run_at_once() {
    ranks("restarts", 2);
}

#[test]
fn a_rank_passing_a_range_it_did_not_register_gets_an_error() {
    ranks("unregistered", 2);
}

#[test]
fn a_rank_that_dies_fails_every_other_member_once() {
    ranks("rank_dies", 3);
}

#[test]
fn killing_the_worker_during_a_large_allreduce_fails_every_rank_once() {
    ranks("kill_worker", 3);
}

// ---------------------------------------------------------------------------------------------
// The rank side.

/// Runs a rank when this process was started as one; otherwise does nothing.
#[test]
fn rank_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let parts: Vec<&str> = role.splitn(5, ',').collect();
    let (scenario, rank, size) = (
        parts[0],
        parts[1].parse().unwrap(),
        parts[2].parse().unwrap(),
    );
    let mut ctx = Ctx::new(rank, size, Path::new(parts[3]), Path::new(parts[4]));
    match scenario {
        "matrix" => matrix(&mut ctx, true),
        "quick" => {
            matrix(&mut ctx, false);
            malformed(&mut ctx);
        }
        "subteams" => {
            matrix(&mut ctx, false);
            subteams(&mut ctx);
        }
        "restarts" => restarts(&mut ctx),
        "unregistered" => unregistered(&mut ctx),
        "rank_dies" => rank_dies(&mut ctx),
        "kill_worker" => kill_worker(&mut ctx),
        other => panic!("unknown scenario {other}"),
    }
    println!("rank scenario done");
}

struct Ctx {
    rank: u32,
    size: u32,
    engine: ProgressEngine,
    _service: Service<Running>,
    host: CollHost,
    worker: Rc<Worker<Running>>,
    oob: SocketOob,
    team: Team,
}

impl Ctx {
    fn new(rank: u32, size: u32, socket: &Path, dir: &Path) -> Self {
        let mut oob = SocketOob::join(
            &RendezvousAddr::Unix(dir.join("oob.sock")),
            size,
            rank,
            Duration::from_secs(120),
        )
        .expect("joining the rendezvous");
        let mut engine = ProgressEngine::new();
        let service = Service::<Idle>::new()
            .set_socket(socket)
            .start()
            .map_err(|(_, e)| e)
            .expect("the service");
        let host = CollHost::new(&service).expect("the collective plugin");
        let worker = Rc::new(
            node_worker(&mut engine, &service, &host, &mut oob).expect("the node's worker"),
        );
        let team = Team::create(&mut engine, &worker, &host, &mut oob, None)
            .expect("a team")
            .expect("every rank is a member");
        assert_eq!((team.rank(), team.size()), (rank, size));
        Self {
            rank,
            size,
            engine,
            _service: service,
            host,
            worker,
            oob,
            team,
        }
    }
}

// ---- Reference arithmetic (independent of the plugin's kernels).

/// Element `i` of rank `r`'s data, as little-endian bits.
fn elem(dt: Datatype, r: u32, i: u64) -> u64 {
    let k = (u64::from(r) * 37 + i * 11 + 3) % 251;
    let f = ((u64::from(r) * 3 + i) % 13) as f32 * 0.5 - 2.0;
    match dt {
        Datatype::I8 | Datatype::I16 | Datatype::I32 | Datatype::I64 => {
            mask(dt, (k as i64 - 100) as u64)
        }
        Datatype::U8 | Datatype::U16 | Datatype::U32 | Datatype::U64 => k,
        Datatype::F16 => u64::from(f16::from_f32(f).to_bits()),
        Datatype::Bf16 => u64::from(bf16::from_f32(f).to_bits()),
        Datatype::F32 => u64::from(f.to_bits()),
        Datatype::F64 => f64::from(f).to_bits(),
        Datatype::Unknown(_) => unreachable!(),
    }
}

fn reduced(dt: Datatype, op: ReduceOp, n: u32, i: u64) -> u64 {
    (1..n).fold(elem(dt, 0, i), |acc, r| fold(dt, op, acc, elem(dt, r, i)))
}

const BUFFER_BYTES: usize = 256 * 1024;

fn buffers(ctx: &mut Ctx) -> Buffers {
    // Where cross-memory attach is forbidden, the user-memory half of the matrix is skipped
    // (and says so), and runs over shared memory instead.
    let user = |ctx: &mut Ctx| match ctx
        .team
        .register(&mut ctx.engine, vec![0u64; BUFFER_BYTES / 8])
    {
        Ok(buffer) => buffer,
        Err(SetupError::CrossMemory(why)) => {
            urom_testkit::skip(&format!("user buffers by cross-memory attach: {why}"));
            ctx.team.alloc(&mut ctx.engine, BUFFER_BYTES).unwrap()
        }
        Err(e) => panic!("registering a user buffer: {e}"),
    };
    Buffers {
        shared_send: ctx.team.alloc(&mut ctx.engine, BUFFER_BYTES).unwrap(),
        shared_recv: ctx.team.alloc(&mut ctx.engine, BUFFER_BYTES).unwrap(),
        user_send: user(ctx),
        user_recv: user(ctx),
    }
}

const KINDS: [CollKind; 11] = [
    CollKind::Barrier,
    CollKind::Bcast,
    CollKind::Reduce,
    CollKind::Allreduce,
    CollKind::Allgather,
    CollKind::Allgatherv,
    CollKind::Alltoall,
    CollKind::Alltoallv,
    CollKind::ReduceScatterBlock,
    CollKind::Gather,
    CollKind::Scatter,
];

fn ops_for(dt: Datatype) -> &'static [ReduceOp] {
    if dt.is_float() {
        &ReduceOp::ALL[..4]
    } else {
        ReduceOp::ALL
    }
}

/// Every collective, datatype and operation (`full`), or a selection, with counts 0, 1, odd
/// and a few thousand, shared and user memory, in place and not.
fn matrix(ctx: &mut Ctx, full: bool) {
    let mut bufs = buffers(ctx);
    let n = u64::from(ctx.size);
    let counts: &[u64] = if full { &[0, 1, 7, 1000] } else { &[0, 1, 9] };
    let dts: &[Datatype] = if full {
        Datatype::ALL
    } else {
        &[Datatype::I32, Datatype::U8, Datatype::F16, Datatype::F64]
    };
    let mut user = false;
    for &kind in &KINDS {
        for &dt in dts {
            let ops: &[ReduceOp] = if kind.reduces() {
                ops_for(dt)
            } else {
                &[ReduceOp::Sum]
            };
            for &op in ops {
                for &count in counts {
                    if count * n * 8 > BUFFER_BYTES as u64 / 2 {
                        continue;
                    }
                    user = !user;
                    let root = (count as u32 + 1) % ctx.size;
                    let in_places: &[bool] = match kind {
                        CollKind::Barrier | CollKind::Bcast => &[false],
                        _ => &[false, true],
                    };
                    for &in_place in in_places {
                        if in_place
                            && !full
                            && !matches!(kind, CollKind::Allreduce | CollKind::Alltoall)
                        {
                            continue;
                        }
                        if in_place && kind.reduces() && op != ReduceOp::Sum && !full {
                            continue;
                        }
                        let case = Case {
                            kind,
                            dt,
                            op,
                            count,
                            root,
                            in_place,
                            user,
                        };
                        let n = ctx.size;
                        run_case(
                            &ctx.team,
                            &mut ctx.engine,
                            &mut bufs,
                            case,
                            n,
                            ctx.rank,
                            elem,
                            &|dt, op, i| reduced(dt, op, n, i),
                        );
                    }
                }
            }
        }
    }
    // Large: an allreduce of 1 MiB and one of 4 MiB + 4 bytes (not a whole number of chunks),
    // in both kinds of memory.
    for (bytes, user) in [(1 << 20, false), ((4 << 20) + 4, true)] {
        large_allreduce(ctx, bytes, user);
    }
    // Float bitwise operations are refused with INVALID_VALUE.
    let mut spec = CollSpec::new(CollKind::Allreduce, Datatype::F32, 4);
    spec.op = ReduceOp::Bxor;
    spec.recv = Some(bufs.shared_recv.whole());
    spec.send = Some(bufs.shared_send.whole());
    match ctx.team.init(&mut ctx.engine, &spec) {
        Err(SetupError::Coll(CollError::Failed {
            status: Status::InvalidValue,
            reason: Reason::InvalidArgs,
            ..
        })) => {}
        other => panic!("a float xor was not refused: {other:?}"),
    }
}

fn large_allreduce(ctx: &mut Ctx, bytes: usize, user: bool) {
    let count = (bytes / 4) as u64;
    let dt = Datatype::F32;
    let mut send = if user {
        ctx.team
            .register(&mut ctx.engine, vec![0f32; bytes / 4])
            .unwrap()
    } else {
        ctx.team.alloc(&mut ctx.engine, bytes).unwrap()
    };
    let recv = ctx.team.alloc(&mut ctx.engine, bytes).unwrap();
    {
        let mut s = send.bytes_mut().unwrap();
        for i in 0..count {
            put(&mut s, dt, i, elem(dt, ctx.rank, i));
        }
    }
    let mut coll = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            Some(&send),
            &recv,
            count,
            dt,
            ReduceOp::Sum,
        )
        .unwrap();
    coll.start().unwrap().wait(&mut ctx.engine).unwrap();
    let r = recv.bytes().unwrap();
    for i in 0..count {
        assert_eq!(
            get(&r, dt, i),
            reduced(dt, ReduceOp::Sum, ctx.size, i),
            "at {i}"
        );
    }
}

/// A command the plugin cannot decode is answered INVALID_VALUE.
fn malformed(ctx: &mut Ctx) {
    use std::sync::atomic::{AtomicI32, Ordering};
    static STATUS: AtomicI32 = AtomicI32::new(-1);
    fn done(task: &urom_host::CompletedTask<'_>) {
        STATUS.store(task.status.raw(), Ordering::SeqCst);
    }
    ctx.worker
        .submit(ctx.host.plugin(), |task| {
            task.payload_mut()[..5].copy_from_slice(b"bogus");
            task.set_callback(done);
            5
        })
        .unwrap();
    while STATUS.load(Ordering::SeqCst) < 0 {
        ctx.engine.progress();
    }
    assert_eq!(STATUS.load(Ordering::SeqCst), Status::InvalidValue.raw());
}

/// Sub-teams of 4 ranks: {3, 1} and {0, 2, 3}, alongside the whole team.
fn subteams(ctx: &mut Ctx) {
    let engine = &mut ctx.engine;
    let a = Team::create(engine, &ctx.worker, &ctx.host, &mut ctx.oob, Some(&[3, 1])).unwrap();
    let b = Team::create(
        engine,
        &ctx.worker,
        &ctx.host,
        &mut ctx.oob,
        Some(&[0, 2, 3]),
    )
    .unwrap();
    assert_eq!(a.is_some(), matches!(ctx.rank, 1 | 3));
    assert_eq!(b.is_some(), matches!(ctx.rank, 0 | 2 | 3));
    for (team, members) in [(a, &[3u32, 1][..]), (b, &[0, 2, 3][..])] {
        let Some(team) = team else { continue };
        let n = members.len() as u32;
        let mut data = team.alloc(engine, 64 * 8).unwrap();
        for (i, v) in data.typed_mut::<u64>().unwrap().iter_mut().enumerate() {
            *v = u64::from(ctx.rank) * 1000 + i as u64;
        }
        let mut sum = team
            .allreduce_init(engine, None, &data, 64, Datatype::U64, ReduceOp::Sum)
            .unwrap();
        sum.start().unwrap().wait(engine).unwrap();
        let total: u64 = members.iter().map(|&m| u64::from(m) * 1000).sum();
        for (i, v) in data.typed::<u64>().unwrap().iter().enumerate() {
            assert_eq!(*v, total + u64::from(n) * i as u64);
        }
    }
}

/// 1,000 restarts of one persistent allreduce allocate nothing; then several collectives in
/// flight on one team, and on two teams at once.
fn restarts(ctx: &mut Ctx) {
    let engine = &mut ctx.engine;
    let mut data = ctx.team.alloc(engine, 1024 * 4).unwrap();
    data.typed_mut::<i32>().unwrap().fill(1);
    let mut allreduce = ctx
        .team
        .allreduce_init(engine, None, &data, 1024, Datatype::I32, ReduceOp::Max)
        .unwrap();
    let mut barrier = ctx.team.barrier_init(engine).unwrap();
    for _ in 0..10 {
        allreduce.start().unwrap().wait(engine).unwrap();
    }
    let allocations = urom_testkit::counting::allocations_in(|| {
        for _ in 0..1000 {
            allreduce.start().unwrap().wait(engine).unwrap();
            barrier.start().unwrap().wait(engine).unwrap();
        }
    });
    assert_eq!(allocations, 0, "allocations in 1,000 starts");
    assert_eq!(allreduce.completions(), 1010);
    assert_eq!(data.typed::<i32>().unwrap()[1023], 1);

    // Several in flight on one team: three collectives started before any is waited for.
    let n = ctx.size;
    let mut bufs = Vec::new();
    let mut colls = Vec::new();
    for k in 0..3u64 {
        let mut b = ctx.team.alloc(engine, 4096 * 8).unwrap();
        b.typed_mut::<u64>().unwrap().fill(k + 1);
        colls.push(
            ctx.team
                .allreduce_init(engine, None, &b, 4096, Datatype::U64, ReduceOp::Sum)
                .unwrap(),
        );
        bufs.push(b);
    }
    let callbacks = Rc::new(std::cell::Cell::new(0u32));
    {
        let seen = Rc::clone(&callbacks);
        colls[2].set_callback(move |result| {
            result.unwrap();
            seen.set(seen.get() + 1);
        });
    }
    let [c0, c1, c2] = &mut colls[..] else {
        unreachable!()
    };
    let r0 = c0.start().unwrap();
    let r1 = c1.start().unwrap();
    let mut r2 = c2.start().unwrap();
    assert!(
        bufs[0].bytes().is_err(),
        "a running collective's buffer is busy"
    );
    r1.wait(engine).unwrap();
    r0.wait(engine).unwrap();
    while r2.test(engine).is_none() {}
    assert_eq!(callbacks.get(), 1);
    for (k, b) in bufs.iter().enumerate() {
        assert!(
            b.typed::<u64>()
                .unwrap()
                .iter()
                .all(|&v| v == (k as u64 + 1) * u64::from(n))
        );
    }

    // Two teams, one collective in flight on each.
    let other = Team::create(engine, &ctx.worker, &ctx.host, &mut ctx.oob, None)
        .unwrap()
        .unwrap();
    let mut x = ctx.team.alloc(engine, 8).unwrap();
    let mut y = other.alloc(engine, 8).unwrap();
    x.typed_mut::<u64>().unwrap()[0] = 2;
    y.typed_mut::<u64>().unwrap()[0] = 3;
    let mut cx = ctx
        .team
        .allreduce_init(engine, None, &x, 1, Datatype::U64, ReduceOp::Prod)
        .unwrap();
    let mut cy = other
        .allreduce_init(engine, None, &y, 1, Datatype::U64, ReduceOp::Sum)
        .unwrap();
    let ry = cy.start().unwrap();
    let rx = cx.start().unwrap();
    rx.wait(engine).unwrap();
    ry.wait(engine).unwrap();
    assert_eq!(x.typed::<u64>().unwrap()[0], 2u64.pow(n));
    assert_eq!(y.typed::<u64>().unwrap()[0], 3 * u64::from(n));
}

/// A rank naming a range outside its registered buffers gets an error, at init; the worker
/// never touches another's bytes.
fn unregistered(ctx: &mut Ctx) {
    let engine = &mut ctx.engine;
    let data = ctx.team.alloc(engine, 64).unwrap();
    // 17 u32 do not fit 64 bytes.
    let mut spec = CollSpec::new(CollKind::Allreduce, Datatype::U32, 17);
    spec.recv = Some(data.whole());
    spec.in_place = true;
    match ctx.team.init(engine, &spec) {
        Err(SetupError::Coll(CollError::Failed {
            status: Status::InvalidValue,
            reason: Reason::OutOfBounds,
            rank: Some(rank),
        })) => assert_eq!(rank, ctx.rank),
        other => panic!("an out-of-bounds range was not refused: {other:?}"),
    }
    // An offset past the end.
    let mut spec = CollSpec::new(CollKind::Bcast, Datatype::U8, 1);
    spec.send = Some(data.at(64));
    assert!(matches!(
        ctx.team.init(engine, &spec),
        Err(SetupError::Coll(CollError::Failed {
            reason: Reason::OutOfBounds,
            ..
        }))
    ));
    // The team still works.
    let mut ok = ctx
        .team
        .allreduce_init(engine, None, &data, 16, Datatype::U32, ReduceOp::Sum)
        .unwrap();
    ok.start().unwrap().wait(engine).unwrap();
}

/// Rank 2 exits after the team formed; the others' allreduce fails once, naming it.
fn rank_dies(ctx: &mut Ctx) {
    let engine = &mut ctx.engine;
    let data = ctx.team.alloc(engine, 1 << 20).unwrap();
    let mut coll = ctx
        .team
        .allreduce_init(engine, None, &data, 1 << 18, Datatype::F32, ReduceOp::Sum)
        .unwrap();
    oob_barrier(&mut ctx.oob);
    if ctx.rank == 2 {
        println!("rank scenario done");
        std::process::exit(0);
    }
    let result = coll.start().unwrap().wait(engine);
    match result {
        Err(CollError::Failed {
            reason: Reason::RankExited,
            rank: Some(2),
            status,
        }) => assert_eq!(status, Status::ConnectionAborted),
        other => panic!("expected rank 2's exit, got {other:?}"),
    }
    assert_eq!(coll.completions(), 1);
    for _ in 0..1000 {
        engine.progress();
    }
    assert_eq!(coll.completions(), 1, "completed exactly once");
    // Later starts fail at once, naming the same rank.
    match coll.start().map(|r| r.wait(engine)) {
        Ok(Err(CollError::Failed { rank: Some(2), .. })) => {}
        other => panic!("a start on the failed team: {other:?}"),
    }
}

/// Rank 0 kills the worker with SIGKILL while a 64 MiB allreduce runs; every rank's request
/// completes once, with an error.
fn kill_worker(ctx: &mut Ctx) {
    let bytes = 64 << 20;
    let data = ctx.team.alloc(&mut ctx.engine, bytes).unwrap();
    let mut coll = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            (bytes / 4) as u64,
            Datatype::F32,
            ReduceOp::Sum,
        )
        .unwrap();
    let request = coll.start().unwrap();
    oob_barrier(&mut ctx.oob);
    if ctx.rank == 0 {
        let pid = ctx.team.worker_pid() as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL)
            .expect("killing the worker");
    }
    let result = request.wait(&mut ctx.engine);
    println!("rank {}: {result:?}", ctx.rank);
    assert!(
        matches!(result, Err(CollError::Worker(_))),
        "expected the worker's death, got {result:?}"
    );
    assert_eq!(coll.completions(), 1);
    for _ in 0..1000 {
        ctx.engine.progress();
    }
    assert_eq!(coll.completions(), 1, "completed exactly once");
    // The worker is gone: a new start fails at once.
    assert!(coll.start().is_err());
}
