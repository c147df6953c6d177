"""Many devices and many hosts, on JAX's own SPMD runtime (docs/scaling.md).

Two ways to use more than one device, chosen by `--parallel`:

    seeds  the runner state's seed axis (axis 0 of every leaf) is sharded over a
           1-D mesh of the devices: each device runs whole seeds, with no
           communication. num_seeds must be a multiple of the device count.
    data   one run's data (the environment batch, and what the algorithm
           derives from it) is sharded over the devices; parameters are
           replicated. The program is the same `jax.jit` program as on one
           device: XLA's SPMD partitioner (GSPMD) splits it and inserts the
           collectives, so the mean of a loss over a sharded batch becomes a
           per-device partial mean plus an all-reduce, which is the `pmean` of
           the gradients, and the numbers equal one device's up to
           floating-point reassociation. An algorithm supports it by naming the
           data axes of its state (`runner.run(..., data_axes=...)`) and
           by `constrain_data` on the batches it learns from.
    off    one device (the default device), the single-device program.
    auto   seeds over the largest device count that divides num_seeds
           (all devices across hosts when `--distributed`); off when that is 1.

On a CPU, `split_cpu` first makes one JAX device per core that divides
num_seeds (auto and seeds modes), so a multi-seed run's seeds run on every
core at once, or in data mode one per core that divides the data axis, so
one run's batch does; `--parallel off` keeps the one device.

With `--distributed`, `jax.distributed.initialize` joins the processes of a
cluster (SLURM, Open MPI and TPU pods are detected by JAX; elsewhere pass
--coordinator-address, --num-processes and --process-id); `jax.devices()` is
then every process's devices and one mesh spans them. Each process runs the
same program on its own devices; only process 0 writes the run directory
(metrics, checkpoints, eval.json); every process reads a checkpoint to resume.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

PARALLEL_MODES = ("auto", "seeds", "data", "off")
SEED_AXIS = "seeds"  # mesh axis name in seeds mode
DATA_AXIS = "data"  # mesh axis name in data mode


@dataclass(frozen=True)
class Layout:
    """How one run is laid out over devices: `mode` is "seeds", "data" or
    "off" (one device, `mesh` None)."""

    mode: str
    mesh: Mesh | None

    @property
    def num_devices(self) -> int:
        return 1 if self.mesh is None else self.mesh.size

    def describe(self) -> str:
        if self.mesh is None:
            return f"1 device ({jax.devices()[0].platform})"
        hosts = f" on {jax.process_count()} processes" if jax.process_count() > 1 else ""
        return f"{self.mode} sharded over {self.num_devices} {self.mesh.devices.flat[0].platform} devices{hosts}"

    def state_shardings(self, abstract_state, data_axes=None):
        """The NamedSharding of every leaf of a seed-stacked state ([num_seeds,
        ...] leaves): seeds mode shards axis 0; data mode shards, in each leaf
        under an int of the prefix tree `data_axes`, that data axis (an axis of
        the per-seed leaf, so axis + 1 here) and replicates the leaves under
        None. None when `mesh` is None."""
        mesh = self.mesh
        if mesh is None:
            return None
        if self.mode == SEED_AXIS:
            return jax.tree.map(lambda _: NamedSharding(mesh, P(SEED_AXIS)), abstract_state)

        def spec(axis, subtree):
            def leaf_spec(leaf):
                # A part named as data but without that axis, or with one the
                # devices do not divide (a wrapper's running statistics), is
                # replicated: shardings change where XLA computes, never what.
                if axis is None or len(leaf.shape) <= axis + 1 or leaf.shape[axis + 1] % self.num_devices:
                    return NamedSharding(mesh, P())
                return NamedSharding(mesh, P(*([None] * (axis + 1)), DATA_AXIS))

            return jax.tree.map(leaf_spec, subtree)

        return jax.tree.map(spec, data_axes, abstract_state, is_leaf=lambda x: x is None)

    def seed_sharding(self):
        """Sharding of host outputs with a leading seed axis (metrics, health,
        evaluation returns): split over devices in seeds mode, replicated in data mode."""
        if self.mesh is None:
            return None
        return NamedSharding(self.mesh, P(SEED_AXIS) if self.mode == SEED_AXIS else P())

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Around the tracing of the training program: in data mode,
        `constrain_data` inside it shards over this layout's mesh."""
        token = _DATA_MESH.set(self.mesh if self.mode == DATA_AXIS else None)
        try:
            yield
        finally:
            _DATA_MESH.reset(token)


_DATA_MESH: contextvars.ContextVar[Mesh | None] = contextvars.ContextVar("jaxzoo_data_mesh", default=None)


def constrain_data(tree, axis: int = 0):
    """Shard axis `axis` of every leaf of `tree` over the devices when the run
    is in data mode (a `jax.lax.with_sharding_constraint`); the identity
    otherwise. Algorithms call it on the batches they learn from (the
    minibatch of a gradient step, the environment batch of a rollout), so the
    forward and backward passes are split over devices after a gather that
    mixes the data (a permutation, a replay sample) and the gradient's mean
    becomes an all-reduce. Under `jax.vmap` over seeds the seed axis stays
    unsharded."""
    mesh = _DATA_MESH.get()
    if mesh is None:
        return tree
    sharding = NamedSharding(mesh, P(*([None] * axis), DATA_AXIS))
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), tree)


def data_device_count() -> int:
    """The devices `constrain_data` splits a batch over while a data-mode
    program is traced (1 otherwise): for a batch that is sharded only when its
    size is a multiple of them (UniZero's evaluation episodes)."""
    mesh = _DATA_MESH.get()
    return 1 if mesh is None else mesh.size


def make_layout(
    parallel: str, num_seeds: int, data_size: int | None = None, data_name: str = "the data axis", why_no_data: str = ""
) -> Layout:
    """The Layout for `--parallel` over the visible devices (every process's,
    after `initialize_distributed`). `data_size` is the size of the data axis
    the algorithm shards in data mode, `data_name` its name in errors (None:
    the algorithm has no data mode, `why_no_data` says why). Raises ValueError
    naming the bad value and what is accepted."""
    if parallel not in PARALLEL_MODES:
        raise ValueError(f"parallel={parallel!r} is not a mode; accepted: {', '.join(PARALLEL_MODES)}")
    devices = jax.devices()
    count = len(devices)
    distributed = jax.process_count() > 1
    if parallel == "off":
        if distributed:
            raise ValueError(
                f"parallel='off' runs on one device, but this run spans {jax.process_count()} processes; "
                "accepted with --distributed: seeds, data or auto"
            )
        return Layout("off", None)
    if parallel == "auto":
        if distributed:
            if num_seeds % count:
                raise ValueError(
                    f"num_seeds={num_seeds} is not a multiple of the {count} devices of the "
                    f"{jax.process_count()} processes; accepted: a multiple of {count} (seeds mode), or --parallel data"
                )
            parallel = "seeds"
        else:
            count = math.gcd(num_seeds, count)
            if count == 1:
                return Layout("off", None)
            parallel = "seeds"
    if parallel == "seeds":
        if num_seeds % count:
            raise ValueError(
                f"--parallel seeds: num_seeds={num_seeds} is not a multiple of the {count} visible devices; "
                f"accepted: num_seeds a multiple of {count} (or --parallel auto, which uses the devices that "
                "divide num_seeds)"
            )
        axis = SEED_AXIS
    else:
        if data_size is None:
            raise ValueError(
                f"--parallel data is not supported by this algorithm{': ' + why_no_data if why_no_data else ''}; "
                "accepted: seeds, auto, off"
            )
        if data_size % count:
            raise ValueError(
                f"--parallel data: {data_name} = {data_size} is not a multiple of the {count} "
                f"visible devices; accepted: a multiple of {count}"
            )
        axis = DATA_AXIS
    mesh = Mesh(np.asarray(devices[:count]), (axis,), axis_types=(jax.sharding.AxisType.Auto,))
    return Layout(parallel, mesh)


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_split(parallel: str, num_seeds: int, distributed: bool, cores: int, data_size: int | None = None) -> int:
    """How many CPU devices `split_cpu` asks for, in a single-process run: in
    auto and seeds modes the largest count that divides num_seeds and is at
    most `cores`; in data mode the largest that divides `data_size` (the
    algorithm's data axis; None: it has no data mode) and is at most `cores`;
    1 (no split) otherwise. With --distributed the device count is the
    cluster's business (and each process's count would multiply by the
    process count)."""
    if distributed:
        return 1
    if parallel in ("auto", "seeds"):
        return math.gcd(num_seeds, max(cores, 1))
    if parallel == "data" and data_size:
        return math.gcd(data_size, max(cores, 1))
    return 1


def split_cpu(args, data_size: int | None = None) -> int:
    """Before JAX creates its CPU backend: one CPU device per core that divides
    `args.num_seeds` (`jax_num_cpu_devices`, `cpu_split`), so `--parallel auto`
    shards the seeds over them and each device runs its seeds' program on its
    own thread; with `--parallel data`, one per core that divides `data_size`
    (the algorithm's data axis), so one run's batch is split over them. XLA:CPU
    spreads only the larger operations of one program over the cores; the
    small ones of an RL update (an MLP on a batch of 128, a CartPole step, a
    search's simulation) run one after another on one core. Measured on 2
    cores (docs/performance.md, "Seeds on every core", "One seed on every
    core"): training loops 1.15-1.6x faster with 4 or 8 seeds. Returns the
    count asked for, or 1 when nothing was changed: one seed in auto mode,
    `--parallel off`, `--distributed`, a device count the user set (XLA_FLAGS'
    --xla_force_host_platform_device_count or jax_num_cpu_devices), or a
    backend that already exists (`main` called in a process that has run JAX:
    its devices stay as they are). Accelerators are untouched: on a GPU or TPU
    machine the CPU devices go unused."""
    count = cpu_split(args.parallel, args.num_seeds, args.distributed, available_cores(), data_size)
    if count <= 1 or cpu_device_count_set():
        return 1
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX refuses once its backends exist
        return 1
    return count


def cpu_device_count_set() -> bool:
    """Whether the CPU device count is already chosen: by the user (XLA_FLAGS'
    --xla_force_host_platform_device_count or jax_num_cpu_devices) or by
    `split_cpu`."""
    forced = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    return forced or getattr(jax.config, "jax_num_cpu_devices", -1) != -1


def start_cpu_backend(threads: int) -> bool:
    """Start JAX's backends now, with XLA:CPU's intra-op thread pool (the
    threads that run one program's independent kernels) cut to `threads`.
    XLA sizes that pool from the cores the process may run on when its backend
    starts, so the affinity mask is cut for the start and given back to every
    thread after it: compiling and the rest of the process keep every core.
    Programs of tiny kernels (PPO's 64-unit MLPs on CartPole) lose more to
    XLA:CPU handing their kernels between threads on different cores than they
    gain: with one thread, PPO's CartPole training loop took 4.3-4.4 s against
    4.8-5.1 s on 2 cores, the same bits (docs/performance.md, "One intra-op
    thread"). Larger kernels lose by it, and convolutions split their work by
    thread, so their numbers change with the pool's size. Returns
    whether it cut the pool; it does nothing with threads = 0 (XLA's default,
    one per core) or at least the cores there are, on an OS without affinity
    masks, once JAX's backends exist, on a CPU whose device count is already
    chosen (`split_cpu`'s several devices, each needing its own thread, or the
    user's count: `cpu_device_count_set`), or with an accelerator plugin
    installed (the cut would size the accelerator client's host threads too)."""
    import importlib.util

    from jax._src import xla_bridge

    if threads <= 0 or not hasattr(os, "sched_setaffinity") or xla_bridge.backends_are_initialized():
        return False
    split = cpu_device_count_set()  # several CPU devices (or a count the user chose): left as they are
    accelerator = any(importlib.util.find_spec(name) is not None for name in ("jax_plugins", "libtpu"))
    cores = os.sched_getaffinity(0)
    if split or accelerator or threads >= len(cores):
        return False
    os.sched_setaffinity(0, set(sorted(cores)[:threads]))
    try:
        jax.devices()
    finally:
        # Threads started meanwhile (XLA's pools) inherited the cut mask: give each the whole one back.
        for thread_id in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else [0]:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(thread_id), cores)
    return True


def initialize_distributed(args) -> None:
    """`jax.distributed.initialize` from the shared Args fields, once per
    process, before any other JAX call; a no-op without `args.distributed`.
    An unreachable coordinator or a process count that does not match fails
    after `args.distributed_timeout` seconds with a message, not a hang."""
    if not args.distributed:
        for name in ("coordinator_address", "num_processes", "process_id"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} needs --distributed")
        return
    if jax.distributed.is_initialized():
        return
    explicit = {
        name: getattr(args, name)
        for name in ("coordinator_address", "num_processes", "process_id")
        if getattr(args, name) is not None
    }
    if explicit and len(explicit) < 3 and args.coordinator_address is not None:
        missing = sorted({"coordinator_address", "num_processes", "process_id"} - set(explicit))
        raise ValueError(
            f"--distributed with --coordinator-address needs --num-processes and --process-id too "
            f"(missing: {', '.join(missing)}); on SLURM, Open MPI or a TPU pod give none of them"
        )
    if args.process_id is not None and args.num_processes is not None and not 0 <= args.process_id < args.num_processes:
        raise ValueError(f"process_id={args.process_id} is outside 0 ... num_processes - 1 = {args.num_processes - 1}")
    if args.coordinator_address is not None and args.process_id not in (None, 0):
        wait_for_coordinator(args.coordinator_address, args.distributed_timeout)
    # Cross-process collectives of CPU devices need an implementation (gloo);
    # accelerators bring their own (NCCL, ICI), which this setting leaves alone.
    if getattr(jax.config, "jax_cpu_collectives_implementation", None) in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    print(
        f"joining a distributed run ({', '.join(f'{k}={v}' for k, v in explicit.items()) or 'cluster detected'}); "
        f"waiting up to {args.distributed_timeout}s for every process (XLA aborts with DEADLINE_EXCEEDED if one "
        "never joins)",
        file=sys.stderr,
        flush=True,
    )
    try:
        jax.distributed.initialize(**explicit, initialization_timeout=args.distributed_timeout)
    except (RuntimeError, ValueError) as error:  # XLA's status errors arrive as RuntimeError / JaxRuntimeError
        raise ValueError(
            f"jax.distributed.initialize failed ({', '.join(f'{k}={v!r}' for k, v in explicit.items()) or 'auto-detected cluster'}, "
            f"timeout {args.distributed_timeout}s): {str(error).splitlines()[0] if str(error) else type(error).__name__}. "
            "Check that every process got the same coordinator address and process count, that the process ids "
            "are distinct, and that the coordinator (process 0) is reachable"
        ) from None


def wait_for_coordinator(address: str, timeout: float) -> None:
    """Raise ValueError if nothing accepts a TCP connection at `address`
    (host:port) within `timeout` seconds. XLA's own client would abort the
    process with a fatal error instead; process 0, which hosts the
    coordinator, cannot be checked this way (a missing process makes XLA
    abort it after the timeout with DEADLINE_EXCEEDED)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator_address={address!r} is not host:port (e.g. node001:1234)")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(5.0, timeout)):
                return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise ValueError(
                    f"the coordinator {address} (process 0) did not answer within distributed_timeout={timeout:g}s "
                    f"({error}); start process 0 with the same --coordinator-address, or check the host and port"
                ) from None
            time.sleep(0.5)


def is_writer() -> bool:
    """Whether this process writes the run directory: process 0."""
    return jax.process_index() == 0


def agree_max(value):
    """The largest of `value` over the processes of a distributed run (each
    must call it at the same point); `value` itself in a single process. Host
    decisions that steer the compiled programs (chunk sizes, a stop) go
    through it, so every process dispatches the same programs."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(value, np.float64))
    result = np.max(gathered)
    return type(value)(result)


def to_host(tree):
    """numpy copies of a pytree of arrays: `jax.device_get`, or, for arrays
    spread over several processes, an all-gather (every process must call it,
    in the same order) so each process holds the whole value."""
    leaves = jax.tree.leaves(tree)
    if all(getattr(x, "is_fully_addressable", True) for x in leaves):
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    def is_key(x) -> bool:
        return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)

    # PRNG keys travel as their raw data and are wrapped again on this host.
    data = jax.tree.map(lambda x: jax.random.key_data(x) if is_key(x) else x, tree)
    gathered = multihost_utils.process_allgather(data, tiled=True)
    return jax.tree.map(
        lambda x, g: jax.random.wrap_key_data(g, impl=jax.random.key_impl(x)) if is_key(x) else g, tree, gathered
    )


def put(host_tree, shardings):
    """Place a host pytree (numpy arrays and typed PRNG keys, the same on every
    process) with `shardings` (one per leaf; None: the default device). Every
    process builds its own shards (`jax.make_array_from_callback`), so this
    works across processes."""
    if shardings is None:
        return jax.device_put(host_tree)

    def place(value, sharding):
        if hasattr(value, "dtype") and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(value))
            spec = tuple(sharding.spec) + (None,) * (data.ndim - len(sharding.spec))
            data_sharding = NamedSharding(sharding.mesh, P(*spec[: data.ndim]))
            placed = jax.make_array_from_callback(data.shape, data_sharding, lambda index: data[index])
            return _wrap_keys(placed, jax.random.key_impl(value), sharding)
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree.map(place, host_tree, shardings)


def _wrap_keys(data, impl, sharding):
    return jax.jit(lambda d: jax.random.wrap_key_data(d, impl=impl), out_shardings=sharding)(data)


def host_array(value: np.ndarray, sharding) -> Any:
    """A host array as a jit input: itself on one device, else placed with
    `sharding` on every process."""
    return value if sharding is None else put(value, sharding)
