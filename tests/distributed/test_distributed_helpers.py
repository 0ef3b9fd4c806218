"""crl.distributed outside a process group, batch sharding, and ``crl train --nproc``."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from crl import distributed
from crl.cli import app
from crl.errors import CrlError, CrlTypeError, CrlValueError


@given(world=st.integers(1, 8), local=st.integers(1, 6))
def test_shards_of_all_ranks_in_rank_order_give_back_the_batch(world: int, local: int) -> None:
    batch = [1000 + i for i in range(world * local)]
    parts = [distributed.shard(batch, r, world) for r in range(world)]
    assert all(len(p) == local for p in parts)
    assert [i for p in parts for i in p] == batch
    assert distributed.local_batch_size(len(batch), world) == local


@given(world=st.integers(2, 8), batch=st.integers(2, 100))
def test_indivisible_batch_is_an_error_naming_both(world: int, batch: int) -> None:
    if batch % world == 0:
        assert distributed.local_batch_size(batch, world) * world == batch
        return
    with pytest.raises(CrlValueError) as info:
        distributed.local_batch_size(batch, world)
    assert f"number of processes {world}; got {batch}" in str(info.value)


def test_outside_a_process_group_everything_is_the_one_process_identity() -> None:
    assert not distributed.is_active()
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    x = torch.randn(4, 3, requires_grad=True)
    assert distributed.all_gather_with_grad(x) is x
    assert distributed.all_gather_tensor(x) is x
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), 3.0)
    distributed.average_gradients([p])
    assert torch.equal(p.grad, torch.full((2,), 3.0))
    assert distributed.broadcast_object({"a": 1}) == {"a": 1}
    assert distributed.run_on_main(lambda: 5) == 5
    with pytest.raises(CrlTypeError, match="boom"):
        distributed.run_on_main(lambda: (_ for _ in ()).throw(CrlTypeError("boom")))
    distributed.barrier()
    distributed.shutdown()


def test_init_from_env_without_torchrun_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert distributed.init_from_env() is False
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.init_from_env() is False
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(CrlValueError, match="WORLD_SIZE"):
        distributed.init_from_env()
    assert not distributed.is_active()


def test_backend_and_device() -> None:
    assert distributed.backend_for("cpu") == "gloo"
    assert distributed.backend_for("cuda:0") == "nccl"
    assert distributed.device_for("cpu") == torch.device("cpu")


def test_free_port_can_be_bound() -> None:
    port = distributed.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))


def test_launch_command() -> None:
    cmd = distributed.launch_command(3, ["train", "x.yaml"], port=1234)
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[cmd.index("--nproc_per_node") + 1] == "3"
    assert cmd[cmd.index("--master_port") + 1] == "1234"
    assert cmd[cmd.index("--master_addr") + 1] == "127.0.0.1"
    assert cmd[-4:] == ["-m", "crl", "train", "x.yaml"]
    with pytest.raises(CrlError, match="--nproc"):
        distributed.launch_command(0, ["train"])


def test_crl_train_nproc_forwards_the_same_arguments(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    seen: list[tuple[int, list[str]]] = []

    def fake_launch(nproc: int, args: list[str]) -> int:
        seen.append((nproc, list(args)))
        return 7

    monkeypatch.setattr(distributed, "launch", fake_launch)
    argv = ["crl", "train", "synthetic-gaussian", "--nproc", "2", "--set", "train.steps=4",
            "--set", "loss.temperature=0.5", "--out", str(tmp_path), "--resume", "--device",
            "cpu", "--no-progress"]
    monkeypatch.setattr(sys, "argv", argv)  # the command line the launcher forwards
    result = CliRunner().invoke(app, argv[1:])
    assert result.exit_code == 7  # torchrun's exit code is forwarded
    assert seen == [(2, ["train", "synthetic-gaussian", "--set", "train.steps=4", "--set",
                         "loss.temperature=0.5", "--out", str(tmp_path), "--resume",
                         "--device", "cpu", "--no-progress"])]
    assert not any(tmp_path.iterdir())  # nothing ran in this process
