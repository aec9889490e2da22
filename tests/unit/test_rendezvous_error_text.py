"""The launcher's ``rendezvous failed`` line says what happened when torch raised its rendezvous
errors without a message (``RendezvousTimeoutError: `` alone told a user nothing; issue 29)."""

from __future__ import annotations

import pytest
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousTimeoutError

from launcher.launch import rendezvous_error_text


@pytest.mark.parametrize(("err", "says"), [
    (RendezvousTimeoutError(), "did not form within join_timeout"),
    (RendezvousTimeoutError(), "--nnodes MIN:MAX"),
    (RendezvousClosedError(), "closed by another node"),
    (RendezvousClosedError(), "see that node's log"),
])
def test_empty_rendezvous_errors_get_a_message(err: Exception, says: str) -> None:
    assert says in rendezvous_error_text(err)


def test_a_message_of_torch_is_kept() -> None:
    assert rendezvous_error_text(RendezvousTimeoutError("round 3 timed out")) == "round 3 timed out"
