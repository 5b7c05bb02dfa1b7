//! Teams spanning nodes end to end: two "machines" (network namespaces joined by a veth pair,
//! a daemon offering `worker_coll` in each), four ranks as real processes (this test binary
//! started again in its namespace, running `rank_entry` only), two per node and interleaved:
//! ranks 0 and 2 on node 0, ranks 1 and 3 on node 1. Each node's ranks share their node's
//! worker; the workers are members of the ranks' domain and exchange the inter-node part over
//! UCX (TCP over the veth pair). Out of band: a socket rendezvous over the veth pair.
//!
//! Reference rules: integers exact; floats as the plugin documents for two nodes: each node's
//! ranks folded in rank order (node 0: `x0 op x2`, node 1: `x1 op x3`), then `P0 op P1`,
//! each step rounded to the datatype; compared bit for bit.
//!
//! Needs root and `ip` (skips, saying why, without them).
#![cfg(feature = "ucx")]

use std::path::Path;
use std::process::Stdio;
use std::rc::Rc;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use urom_coll::{
    Buffer, CollError, CollHost, CollKind, CollSpec, Datatype, Reason, ReduceOp, Team, node_worker,
};
use urom_host::oob::{RendezvousAddr, SocketOob};
use urom_host::{Domain, DomainStartProgress, Idle, ProgressEngine, Running, Service, Worker};
use urom_testkit::daemon::{Daemon, plugin_dir, start_daemon_command};
use urom_testkit::netns::Network;
use urom_testkit::{TempDir, binary};
use urom_wire::Status;

mod reference;
use reference::*;

const ROLE: &str = "UROM_COLL_NODES_ROLE";
const SIZE: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(120);
/// The UCX settings of the workers and ranks: TCP only between machines (shared memory would
/// cross the namespaces, which share one kernel).
const UCX_ENV: [(&str, &str); 2] = [("UCX_TLS", "tcp,self"), ("UCX_WARN_UNUSED_ENV_VARS", "n")];

// ---------------------------------------------------------------------------------------------
// The parent side: namespaces, daemons, rank processes.

fn free_port(network: &Network) -> u16 {
    let hub = network.hub_address(1);
    network.run_in(0, || {
        std::net::TcpListener::bind((hub, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    })
}

/// One scenario at a time: the namespaces of a test process are named after it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `scenario` on 4 rank processes on two machines; panics with their output unless all
/// succeed.
fn ranks(scenario: &str) {
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let network = match Network::create("coll", 2) {
        Ok(network) => network,
        Err(why) => {
            urom_testkit::skip(&why);
            return;
        }
    };
    let plugins = TempDir::new("urom-coll-nodes-plugins");
    let dir = plugin_dir(&plugins, &[("urom-plugin-coll", "worker_coll")]);
    let daemon_bin = binary("urom-daemon", "urom-daemon");
    let daemons: Vec<Daemon> = (0..2)
        .map(|i| {
            let mut command = network.command(i, &daemon_bin);
            command
                .envs(UCX_ENV)
                .env("UCX_NET_DEVICES", network.device(i, 1 - i));
            start_daemon_command(command, dir.to_str().unwrap(), &[], true)
        })
        .collect();
    let run = TempDir::new("urom-coll-nodes-run");
    let hub = network.hub_address(1);
    let (world, domain) = (free_port(&network), free_port(&network));
    let exe = std::env::current_exe().expect("the test binary");
    let children: Vec<_> = (0..SIZE)
        .map(|rank| {
            let node = (rank % 2) as usize;
            let mut command = network.command(node, &exe);
            command
                .args(["--exact", "rank_entry", "--nocapture", "--test-threads=1"])
                .envs(UCX_ENV)
                .env("UCX_NET_DEVICES", network.device(node, 1 - node))
                .env(
                    ROLE,
                    format!(
                        "{scenario},{rank},{},{hub}:{world},{hub}:{domain},{}",
                        daemons[node].socket.display(),
                        run.path().display()
                    ),
                )
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            command.spawn().expect("starting a rank")
        })
        .collect();
    // A safety net against a hang, far beyond any run's time; not a performance bound.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut failed = Vec::new();
    for (rank, mut child) in children.into_iter().enumerate() {
        while child.try_wait().expect("waiting for a rank").is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("a rank's output");
        let stdout = String::from_utf8_lossy(&out.stdout);
        print!("{stdout}");
        if !(out.status.success() && stdout.contains("rank scenario done")) {
            failed.push(format!(
                "rank {rank} ({}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(
        failed.is_empty(),
        "{scenario} failed:\n{}\nnode 0's daemon:\n{}\nnode 1's daemon:\n{}",
        failed.join("\n"),
        daemons[0].log(),
        daemons[1].log()
    );
    // The daemons and their workers go before the namespaces.
    drop(daemons);
    drop(network);
}

#[test]
fn collectives_across_two_nodes_match_the_reference() {
    ranks("collectives");
}

#[test]
fn copy_collectives_across_two_nodes_match_the_reference() {
    ranks("copies");
}

#[test]
fn a_rank_exiting_on_one_node_fails_every_member_on_both_nodes_once() {
    ranks("rank_exits");
}

#[test]
fn counts_that_differ_between_nodes_fail_with_nodes_disagree_on_every_rank() {
    ranks("disagree");
}

#[test]
fn a_killed_peer_worker_fails_every_member_once() {
    ranks("peer_dies");
}

#[test]
fn a_silent_peer_worker_fails_the_other_node_after_its_timeout() {
    ranks("peer_silent");
}

// ---------------------------------------------------------------------------------------------
// The rank side.

#[test]
fn rank_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let parts: Vec<&str> = role.splitn(6, ',').collect();
    let rank: u32 = parts[1].parse().unwrap();
    let mut ctx = Ctx::new(
        rank,
        Path::new(parts[2]),
        parts[3],
        parts[4],
        Path::new(parts[5]),
    );
    match parts[0] {
        "collectives" => collectives(&mut ctx),
        "copies" => copies(&mut ctx),
        "rank_exits" => rank_exits(&mut ctx),
        "disagree" => disagree(&mut ctx),
        "peer_dies" => peer_dies(&mut ctx),
        "peer_silent" => peer_silent(&mut ctx),
        other => panic!("unknown scenario {other}"),
    }
    println!("rank scenario done");
}

struct Ctx {
    rank: u32,
    engine: ProgressEngine,
    _service: Service<Running>,
    host: CollHost,
    worker: Rc<Worker<Running>>,
    world: SocketOob,
    domain: Domain<Running>,
    team: Team,
}

fn node_of(rank: u32) -> u32 {
    rank % 2
}

impl Ctx {
    fn new(rank: u32, socket: &Path, world: &str, domain: &str, dir: &Path) -> Self {
        let node = node_of(rank);
        // The node's ranks find their worker through a rendezvous of their own.
        let mut node_oob = SocketOob::join(
            &RendezvousAddr::Unix(dir.join(format!("node{node}.sock"))),
            2,
            rank / 2,
            TIMEOUT,
        )
        .expect("the node's rendezvous");
        let mut engine = ProgressEngine::new();
        let service = Service::<Idle>::new()
            .set_socket(socket)
            .start()
            .map_err(|(_, e)| e)
            .expect("the service");
        let host = CollHost::new(&service).expect("the collective plugin");
        let worker = Rc::new(
            node_worker(&mut engine, &service, &host, &mut node_oob).expect("the node's worker"),
        );
        let domain_oob = SocketOob::join(&RendezvousAddr::Tcp(domain.into()), SIZE, rank, TIMEOUT)
            .expect("the domain's rendezvous");
        let domain = Domain::new()
            .set_oob(domain_oob)
            .set_workers(&[u64::from(rank)], &[&*worker])
            .unwrap()
            .start(&mut engine)
            .map_err(|(_, e)| e)
            .expect("the domain starts");
        let domain = match domain.wait_running(&mut engine, TIMEOUT) {
            Ok(domain) => domain,
            Err(DomainStartProgress::Failed(_, e)) => panic!("rank {rank}: {e}"),
            Err(DomainStartProgress::Starting(_)) => panic!("rank {rank}: no domain"),
        };
        let mut world = SocketOob::join(&RendezvousAddr::Tcp(world.into()), SIZE, rank, TIMEOUT)
            .expect("the world's rendezvous");
        let team = Team::create_in_domain(
            &mut engine,
            &worker,
            &host,
            &mut world,
            None,
            &domain,
            u64::from(rank),
        )
        .expect("a team")
        .expect("every rank is a member");
        assert_eq!((team.rank(), team.size()), (rank, SIZE));
        Self {
            rank,
            engine,
            _service: service,
            host,
            worker,
            world,
            domain,
            team,
        }
    }
}

// ---- Reference arithmetic (independent of the plugin's kernels).

/// Element `i` of rank `r`'s data, as little-endian bits.
fn elem(dt: Datatype, r: u32, i: u64) -> u64 {
    let k = (u64::from(r) * 37 + i * 11 + 3) % 251;
    let f = ((u64::from(r) * 3 + i) % 13) as f32 * 0.37 - 2.0;
    match dt {
        Datatype::I8 | Datatype::I16 | Datatype::I32 | Datatype::I64 => {
            mask(dt, (k as i64 - 100) as u64)
        }
        Datatype::U8 | Datatype::U16 | Datatype::U32 | Datatype::U64 => k,
        Datatype::F16 => u64::from(f16::from_f32(f).to_bits()),
        Datatype::Bf16 => u64::from(bf16::from_f32(f).to_bits()),
        Datatype::F32 => u64::from(f.to_bits()),
        Datatype::F64 => (f64::from(f) * 1.1).to_bits(),
        Datatype::Unknown(_) => unreachable!(),
    }
}

/// The documented order for two nodes: each node's ranks in rank order, then node 0's partial
/// op node 1's.
fn reduced(dt: Datatype, op: ReduceOp, i: u64) -> u64 {
    let partial = |node: u32| {
        let mut ranks = (0..SIZE).filter(|&r| node_of(r) == node);
        let first = ranks.next().unwrap();
        ranks.fold(elem(dt, first, i), |acc, r| {
            fold(dt, op, acc, elem(dt, r, i))
        })
    };
    fold(dt, op, partial(0), partial(1))
}

// ---- Scenarios.

/// One megabyte and a bit, in elements of 4 bytes: not a whole number of windows.
const LARGE: u64 = (1 << 18) + 3;
const BUFFER: usize = 8 * LARGE as usize;

fn ops_for(dt: Datatype) -> &'static [ReduceOp] {
    if dt.is_float() {
        &[ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max]
    } else {
        ReduceOp::ALL
    }
}

/// Fills `buffer` with `count` elements of this rank's data.
fn fill(buffer: &mut Buffer, dt: Datatype, rank: u32, count: u64) {
    let mut bytes = buffer.bytes_mut().unwrap();
    bytes.fill(0xa5);
    for i in 0..count {
        put(&mut bytes, dt, i, elem(dt, rank, i));
    }
}

#[allow(clippy::too_many_arguments)]
fn reduction(
    ctx: &mut Ctx,
    send: &mut Buffer,
    recv: &mut Buffer,
    kind: CollKind,
    dt: Datatype,
    op: ReduceOp,
    count: u64,
    root: u32,
    in_place: bool,
) {
    let me = ctx.rank;
    let is_root = kind == CollKind::Allreduce || me == root;
    if in_place && is_root {
        fill(recv, dt, me, count);
    } else {
        fill(send, dt, me, count);
        recv.bytes_mut().unwrap().fill(0xa5);
    }
    let mut spec = CollSpec::new(kind, dt, count);
    spec.op = op;
    spec.root = root;
    spec.recv = Some(recv.whole());
    if in_place && is_root {
        spec.in_place = true;
    } else {
        spec.send = Some(send.whole());
    }
    let mut coll = ctx.team.init(&mut ctx.engine, &spec).unwrap();
    coll.start()
        .unwrap()
        .wait(&mut ctx.engine)
        .unwrap_or_else(|e| panic!("{kind:?} {dt:?} {op:?} count {count} root {root}: {e}"));
    if is_root {
        let r = recv.bytes().unwrap();
        for i in 0..count {
            assert_eq!(
                get(&r, dt, i),
                reduced(dt, op, i),
                "{kind:?} {dt:?} {op:?} count {count} in place {in_place}: element {i}"
            );
        }
        assert!(
            r[count as usize * es(dt)..].iter().all(|&b| b == 0xa5),
            "{kind:?} wrote past its count"
        );
    } else {
        assert!(
            recv.bytes().unwrap().iter().all(|&b| b == 0xa5),
            "a reduce wrote to a rank that is not its root"
        );
    }
}

fn bcast(ctx: &mut Ctx, buffer: &mut Buffer, dt: Datatype, count: u64, root: u32) {
    let me = ctx.rank;
    if me == root {
        fill(buffer, dt, me, count);
    } else {
        buffer.bytes_mut().unwrap().fill(0xa5);
    }
    let mut coll = ctx
        .team
        .bcast_init(&mut ctx.engine, buffer, count, dt, root)
        .unwrap();
    coll.start().unwrap().wait(&mut ctx.engine).unwrap();
    let b = buffer.bytes().unwrap();
    for i in 0..count {
        assert_eq!(get(&b, dt, i), elem(dt, root, i), "bcast from {root}: {i}");
    }
    assert!(b[count as usize * es(dt)..].iter().all(|&x| x == 0xa5));
}

/// Established TCP connections of process `pid` (in its network namespace).
fn tcp_connections(pid: u32) -> usize {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    l.strip_prefix("socket:[")
                        .and_then(|s| s.strip_suffix(']'))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    ["tcp", "tcp6"]
        .iter()
        .flat_map(|file| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{file}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 9 && fields[3] == "01" && inodes.iter().any(|i| i == fields[9])
        })
        .count()
}

fn collectives(ctx: &mut Ctx) {
    let me = ctx.rank;
    let worker_pid = ctx.team.worker_pid();
    // A team of one node's ranks, made through the domain, stays on that node: its worker
    // opens no connection.
    let members: [[u32; 2]; 2] = [[0, 2], [1, 3]];
    let mine = members[node_of(me) as usize];
    let mut sub = None;
    for group in members {
        let team = Team::create_in_domain(
            &mut ctx.engine,
            &ctx.worker,
            &ctx.host,
            &mut ctx.world,
            Some(&group),
            &ctx.domain,
            u64::from(me),
        )
        .unwrap();
        if group == mine {
            sub = Some(team.expect("a member"));
        }
    }
    let sub = sub.unwrap();
    let data = sub.alloc(&mut ctx.engine, 64).unwrap();
    let mut sum = sub
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            16,
            Datatype::U32,
            ReduceOp::Sum,
        )
        .unwrap();
    sum.start().unwrap().wait(&mut ctx.engine).unwrap();
    if me / 2 == 0 {
        assert_eq!(
            tcp_connections(worker_pid),
            0,
            "a single-node team's worker opened a connection"
        );
        println!("rank {me}: the single-node team's worker has no TCP connection");
    }
    drop(sum);
    drop(data);
    drop(sub);
    oob_barrier(&mut ctx.world);

    let mut send = ctx.team.alloc(&mut ctx.engine, BUFFER).unwrap();
    let mut recv = ctx
        .team
        .register(&mut ctx.engine, vec![0u64; BUFFER / 8])
        .unwrap();
    // Barriers.
    let mut barrier = ctx.team.barrier_init(&mut ctx.engine).unwrap();
    for _ in 0..3 {
        barrier.start().unwrap().wait(&mut ctx.engine).unwrap();
    }
    // Every datatype and operation, counts 0, 1 and odd, in place and not, both reductions.
    for &dt in Datatype::ALL {
        for &op in ops_for(dt) {
            for count in [0, 1, 7] {
                reduction(
                    ctx,
                    &mut send,
                    &mut recv,
                    CollKind::Allreduce,
                    dt,
                    op,
                    count,
                    0,
                    false,
                );
            }
        }
        reduction(
            ctx,
            &mut send,
            &mut recv,
            CollKind::Allreduce,
            dt,
            ReduceOp::Sum,
            1001,
            0,
            true,
        );
        reduction(
            ctx,
            &mut send,
            &mut recv,
            CollKind::Reduce,
            dt,
            ReduceOp::Max,
            33,
            1,
            false,
        );
        reduction(
            ctx,
            &mut send,
            &mut recv,
            CollKind::Reduce,
            dt,
            ReduceOp::Sum,
            5,
            2,
            true,
        );
    }
    // Large: past the recursive doubling's limit, the ring in several windows.
    for (dt, op) in [
        (Datatype::F32, ReduceOp::Sum),
        (Datatype::I32, ReduceOp::Prod),
        (Datatype::Bf16, ReduceOp::Sum),
    ] {
        reduction(
            ctx,
            &mut send,
            &mut recv,
            CollKind::Allreduce,
            dt,
            op,
            LARGE,
            0,
            false,
        );
    }
    reduction(
        ctx,
        &mut send,
        &mut recv,
        CollKind::Allreduce,
        Datatype::F64,
        ReduceOp::Sum,
        LARGE,
        0,
        true,
    );
    reduction(
        ctx,
        &mut send,
        &mut recv,
        CollKind::Reduce,
        Datatype::F32,
        ReduceOp::Sum,
        LARGE,
        3,
        false,
    );
    // Broadcasts from each rank, counts 0, 1, odd and large.
    for root in 0..SIZE {
        for count in [0, 1, 7, LARGE] {
            bcast(ctx, &mut send, Datatype::U32, count, root);
        }
    }
    bcast(ctx, &mut recv, Datatype::F16, 999, 1);
    // Several collectives in flight on the team.
    let data = ctx.team.alloc(&mut ctx.engine, 4096).unwrap();
    let mut a = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            512,
            Datatype::U32,
            ReduceOp::Sum,
        )
        .unwrap();
    let mut b = ctx.team.barrier_init(&mut ctx.engine).unwrap();
    for _ in 0..20 {
        let ra = a.start().unwrap();
        let rb = b.start().unwrap();
        rb.wait(&mut ctx.engine).unwrap();
        ra.wait(&mut ctx.engine).unwrap();
    }
    // Ranks of one node that start long after the other node's (past the peer timeout) are not
    // taken for a dead worker: their worker answers the other's pings meanwhile.
    oob_barrier(&mut ctx.world);
    if node_of(me) == 1 {
        std::thread::sleep(Duration::from_secs(7));
    }
    let began = Instant::now();
    a.start().unwrap().wait(&mut ctx.engine).unwrap();
    println!(
        "rank {me}: an allreduce with late peers took {:?}",
        began.elapsed()
    );
    // The team spanning nodes did connect its workers: the check above can see connections.
    if me / 2 == 0 {
        assert!(
            tcp_connections(worker_pid) > 0,
            "no connection between the workers"
        );
    }
}

/// Node 1's worker is killed; node 0's ranks' allreduce fails once, naming node 1, and node
/// 1's ranks learn their worker died.
fn peer_dies(ctx: &mut Ctx) {
    let me = ctx.rank;
    let data = ctx.team.alloc(&mut ctx.engine, 1 << 20).unwrap();
    let mut coll = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            1 << 18,
            Datatype::F32,
            ReduceOp::Sum,
        )
        .unwrap();
    coll.start().unwrap().wait(&mut ctx.engine).unwrap();
    oob_barrier(&mut ctx.world);
    if me == 1 {
        let pid = ctx.team.worker_pid() as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL)
            .expect("killing node 1's worker");
    }
    oob_barrier(&mut ctx.world);
    let began = Instant::now();
    let result = coll.start().map(|request| request.wait(&mut ctx.engine));
    println!("rank {me}: {result:?} after {:?}", began.elapsed());
    if node_of(me) == 0 {
        match result {
            Ok(Err(
                error @ CollError::Failed {
                    status: Status::ConnectionAborted,
                    reason: Reason::PeerWorker,
                    ..
                },
            )) => {
                assert_eq!(error.node(), Some(1), "{error}");
                assert!(error.to_string().contains("node 1"), "{error}");
            }
            other => panic!("expected node 1's worker to be named, got {other:?}"),
        }
        assert_eq!(coll.completions(), 2);
        for _ in 0..1000 {
            ctx.engine.progress();
        }
        assert_eq!(coll.completions(), 2, "completed exactly once");
        // The team failed: a later start fails at once, naming node 1 again.
        match coll.start().map(|r| r.wait(&mut ctx.engine)) {
            Ok(Err(error)) => assert_eq!(error.node(), Some(1), "{error}"),
            other => panic!("a start on the failed team: {other:?}"),
        }
    } else {
        assert!(
            matches!(result, Err(_) | Ok(Err(CollError::Worker(_)))),
            "expected the worker's death, got {result:?}"
        );
    }
}

/// Node 1's worker stops (SIGSTOP: alive, its connections open, answering nothing); node 0's
/// ranks' allreduce fails once, naming node 1, after the peer timeout. Then node 1's worker is
/// killed so that its ranks end.
fn peer_silent(ctx: &mut Ctx) {
    let me = ctx.rank;
    let data = ctx.team.alloc(&mut ctx.engine, 4096).unwrap();
    let mut coll = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            1024,
            Datatype::U32,
            ReduceOp::Sum,
        )
        .unwrap();
    coll.start().unwrap().wait(&mut ctx.engine).unwrap();
    oob_barrier(&mut ctx.world);
    let pid = nix::unistd::Pid::from_raw(ctx.team.worker_pid() as i32);
    if me == 1 {
        nix::sys::signal::kill(pid, nix::sys::signal::SIGSTOP).expect("stopping node 1's worker");
    }
    oob_barrier(&mut ctx.world);
    if node_of(me) == 0 {
        let began = Instant::now();
        let result = coll.start().unwrap().wait(&mut ctx.engine);
        println!("rank {me}: {result:?} after {:?}", began.elapsed());
        match result {
            Err(
                error @ CollError::Failed {
                    reason: Reason::PeerWorker,
                    ..
                },
            ) => assert_eq!(error.node(), Some(1), "{error}"),
            other => panic!("expected node 1's silent worker to be named, got {other:?}"),
        }
        assert_eq!(coll.completions(), 2);
    }
    oob_barrier(&mut ctx.world);
    if me == 1 {
        nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL).expect("killing node 1's worker");
    }
}

// ---- Copy collectives and reduce-scatter across nodes (the single-node matrix's rules).

/// Room for an alltoall of `LARGE` elements of 4 bytes per block, and a little more.
const COPY_BYTES: usize = 4 * 4 * LARGE as usize + 4096;

/// Runs `case` on every rank and checks this rank's result against the sequential reference.
fn copy_case(ctx: &mut Ctx, buffers: &mut Buffers, case: Case) {
    let me = ctx.rank;
    run_case(
        &ctx.team,
        &mut ctx.engine,
        buffers,
        case,
        SIZE,
        me,
        elem,
        &reduced,
    );
}

fn copies(ctx: &mut Ctx) {
    let mut buffers = Buffers {
        shared_send: ctx.team.alloc(&mut ctx.engine, COPY_BYTES).unwrap(),
        shared_recv: ctx.team.alloc(&mut ctx.engine, COPY_BYTES).unwrap(),
        user_send: ctx
            .team
            .register(&mut ctx.engine, vec![0u64; COPY_BYTES / 8])
            .unwrap(),
        user_recv: ctx
            .team
            .register(&mut ctx.engine, vec![0u64; COPY_BYTES / 8])
            .unwrap(),
    };
    let kinds = [
        CollKind::Allgather,
        CollKind::Allgatherv,
        CollKind::Alltoall,
        CollKind::Alltoallv,
        CollKind::ReduceScatterBlock,
        CollKind::Gather,
        CollKind::Scatter,
    ];
    let mut case = Case {
        kind: CollKind::Allgather,
        dt: Datatype::U32,
        op: ReduceOp::Sum,
        count: 0,
        root: 0,
        in_place: false,
        user: false,
    };
    for kind in kinds {
        for count in [0, 1, 7] {
            for in_place in [false, true] {
                for root in [1, 2] {
                    if root == 2 && !matches!(kind, CollKind::Gather | CollKind::Scatter) {
                        continue;
                    }
                    case.kind = kind;
                    case.count = count;
                    case.in_place = in_place;
                    case.root = root;
                    case.user = count % 2 == 1;
                    case.dt = if kind == CollKind::ReduceScatterBlock {
                        Datatype::F32
                    } else {
                        Datatype::U32
                    };
                    copy_case(ctx, &mut buffers, case);
                }
            }
        }
    }
    // Larger than a window: several windows per stream, shared and user memory, in place.
    for (kind, in_place, user) in [
        (CollKind::Allgather, false, false),
        (CollKind::Allgather, true, true),
        (CollKind::Alltoall, false, true),
        (CollKind::Alltoall, true, false),
        (CollKind::ReduceScatterBlock, false, false),
        (CollKind::ReduceScatterBlock, true, true),
        (CollKind::Gather, false, true),
        (CollKind::Scatter, false, false),
    ] {
        case.kind = kind;
        case.count = LARGE;
        case.in_place = in_place;
        case.user = user;
        case.root = 3;
        case.dt = if kind == CollKind::ReduceScatterBlock {
            Datatype::F32
        } else {
            Datatype::U32
        };
        copy_case(ctx, &mut buffers, case);
    }
    // Two bytes per element, an odd count.
    for kind in kinds {
        case.kind = kind;
        case.count = 1001;
        case.in_place = false;
        case.user = false;
        case.root = 1;
        case.dt = if kind == CollKind::ReduceScatterBlock {
            Datatype::Bf16
        } else {
            Datatype::F16
        };
        copy_case(ctx, &mut buffers, case);
    }
}

/// Rank 3 (node 1) exits while the other ranks run an allreduce: every other rank's request
/// completes once with an error naming rank 3, node 0's through node 1's abort message.
fn rank_exits(ctx: &mut Ctx) {
    let me = ctx.rank;
    let data = ctx.team.alloc(&mut ctx.engine, 1 << 20).unwrap();
    let mut coll = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            1 << 18,
            Datatype::F32,
            ReduceOp::Sum,
        )
        .unwrap();
    coll.start().unwrap().wait(&mut ctx.engine).unwrap();
    oob_barrier(&mut ctx.world);
    if me == 3 {
        oob_barrier(&mut ctx.world);
        println!("rank scenario done");
        std::process::exit(0);
    }
    let request = coll.start().unwrap();
    oob_barrier(&mut ctx.world);
    let began = Instant::now();
    let result = request.wait(&mut ctx.engine);
    println!("rank {me}: {result:?} after {:?}", began.elapsed());
    match result {
        Err(
            error @ CollError::Failed {
                status: Status::ConnectionAborted,
                reason: Reason::RankExited | Reason::RankDisconnected,
                rank: Some(3),
            },
        ) => assert!(error.to_string().contains("rank 3"), "{error}"),
        other => panic!("expected rank 3 named, got {other:?}"),
    }
    assert!(began.elapsed() < Duration::from_secs(5), "not told at once");
    assert_eq!(coll.completions(), 2);
    for _ in 0..1000 {
        ctx.engine.progress();
    }
    assert_eq!(coll.completions(), 2, "completed exactly once");
    match coll.start().map(|r| r.wait(&mut ctx.engine)) {
        Ok(Err(CollError::Failed { rank: Some(3), .. })) => {}
        other => panic!("a start on the failed team: {other:?}"),
    }
}

/// Node 0's ranks give one count, node 1's another: every rank's collective fails with
/// `NodesDisagree` naming the other node (an allreduce, then an allgather on a new team);
/// a team created again then works.
fn disagree(ctx: &mut Ctx) {
    let me = ctx.rank;
    let other = 1 - node_of(me);
    let data = ctx.team.alloc(&mut ctx.engine, 4096).unwrap();
    let count = if node_of(me) == 0 { 7 } else { 9 };
    let mut coll = ctx
        .team
        .allreduce_init(
            &mut ctx.engine,
            None,
            &data,
            count,
            Datatype::U32,
            ReduceOp::Sum,
        )
        .unwrap();
    let began = Instant::now();
    let result = coll.start().unwrap().wait(&mut ctx.engine);
    println!("rank {me}: {result:?} after {:?}", began.elapsed());
    let expect_disagree = |result: Result<(), CollError>| match result {
        Err(
            error @ CollError::Failed {
                status: Status::InvalidValue,
                reason: Reason::NodesDisagree,
                ..
            },
        ) => {
            assert_eq!(error.node(), Some(other), "{error}");
            assert!(
                error.to_string().contains(&format!("node {other}")),
                "{error}"
            );
        }
        other => panic!("expected NodesDisagree, got {other:?}"),
    };
    expect_disagree(result);
    assert_eq!(coll.completions(), 1);
    drop(coll);
    drop(data);
    // A new team: an allgather whose counts differ between the nodes.
    oob_barrier(&mut ctx.world);
    let team = Team::create_in_domain(
        &mut ctx.engine,
        &ctx.worker,
        &ctx.host,
        &mut ctx.world,
        None,
        &ctx.domain,
        u64::from(me),
    )
    .unwrap()
    .unwrap();
    let send = team.alloc(&mut ctx.engine, 4096).unwrap();
    let recv = team.alloc(&mut ctx.engine, 4096).unwrap();
    let mut spec = CollSpec::new(
        CollKind::Allgather,
        Datatype::U8,
        3 + u64::from(node_of(me)),
    );
    spec.send = Some(send.whole());
    spec.recv = Some(recv.whole());
    let mut coll = team.init(&mut ctx.engine, &spec).unwrap();
    expect_disagree(coll.start().unwrap().wait(&mut ctx.engine));
    drop(coll);
    drop((send, recv, team));
    // And one that agrees works.
    oob_barrier(&mut ctx.world);
    let team = Team::create_in_domain(
        &mut ctx.engine,
        &ctx.worker,
        &ctx.host,
        &mut ctx.world,
        None,
        &ctx.domain,
        u64::from(me),
    )
    .unwrap()
    .unwrap();
    let mut send = team.alloc(&mut ctx.engine, 4096).unwrap();
    let recv = team.alloc(&mut ctx.engine, 4096).unwrap();
    send.bytes_mut().unwrap()[..5].fill(me as u8 + 1);
    let mut spec = CollSpec::new(CollKind::Allgather, Datatype::U8, 5);
    spec.send = Some(send.whole());
    spec.recv = Some(recv.whole());
    let mut coll = team.init(&mut ctx.engine, &spec).unwrap();
    coll.start().unwrap().wait(&mut ctx.engine).unwrap();
    drop(coll);
    let r = recv.bytes().unwrap();
    for src in 0..SIZE as usize {
        assert!(r[src * 5..src * 5 + 5].iter().all(|&b| b == src as u8 + 1));
    }
}
