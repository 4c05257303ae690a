"""The per-process API write slots (topoweb.middleware.WriteSlotsMiddleware), through Django's
whole request handler, with views that hold their request until the test lets them go: writes
beyond the slots wait, reads and exempt views do not, a write that waits too long is a 503 with
Retry-After, and a slot comes back whatever the view did."""

from __future__ import annotations

import queue
import threading

import pytest
from django.test import Client
from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.writeslots import after_write_slot, slot_lent
from apps.executors.agents.api.views import AgentSyncView
from tests.writeslots import slot_free

entered: queue.Queue = queue.Queue()
go = threading.Event()


class Hold(APIView):
    """Reports that it runs, then waits for `go` (a write) or answers at once (a read)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    def post(self, request):
        entered.put(request.data["n"])
        if request.data.get("fail"):
            raise RuntimeError("the view failed")
        go.wait(10)
        return Response({"n": request.data["n"]})

    def get(self, request):
        return Response({"read": True})


class Exempt(Hold):
    write_slot = False


after: list[tuple] = []


class After(APIView):
    """Leaves work until its slot is free: it records whether the slot was free when it ran."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    def work(self, n: int) -> None:
        after.append((n, slot_free()))
        if n == 2:
            raise RuntimeError("the work failed")

    def post(self, request):
        n = request.data["n"]
        after_write_slot(request, lambda: self.work(n))
        after.append((n, "view"))
        return Response({"n": n})

    def get(self, request):
        after_write_slot(request, lambda: self.work(0))
        after.append((0, "view"))
        return Response({"read": True})


lent: queue.Queue = queue.Queue()
lend_go = threading.Event()


class Lend(APIView):
    """Lends its slot while it waits for `lend_go` (as a COMMIT lends it while the server flushes),
    then reports that it has the slot back."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes: list = []

    def post(self, request):
        with slot_lent():
            lent.put("lent")
            lend_go.wait(10)
        lent.put("back")
        return Response({"lent": True})


urlpatterns = [
    path("lend/", Lend.as_view()),
    path("hold/", Hold.as_view()),
    path("exempt/", Exempt.as_view()),
    path("after/", After.as_view()),
]

pytestmark = pytest.mark.urls(__name__)


@pytest.fixture(autouse=True)
def fresh():
    go.clear()
    while not entered.empty():
        entered.get_nowait()
    yield
    go.set()


def post_in_thread(where: str, n: int, answers: dict) -> threading.Thread:
    def run():
        answers[n] = Client(raise_request_exception=False).post(
            where, {"n": n}, content_type="application/json"
        )

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_second_write_waits_for_the_first_while_reads_go_on(settings):
    settings.API_WRITE_SLOTS = 1
    answers: dict = {}
    first = post_in_thread("/hold/", 1, answers)
    assert entered.get(timeout=5) == 1
    second = post_in_thread("/hold/", 2, answers)
    with pytest.raises(queue.Empty):
        entered.get(timeout=0.3)  # waiting for the slot, not in the view
    assert Client().get("/hold/").json() == {"read": True}  # a read needs no slot
    go.set()
    assert entered.get(timeout=5) == 2
    first.join(5)
    second.join(5)
    assert answers[1].status_code == answers[2].status_code == 200


def test_two_slots_run_two_writes_at_once(settings):
    settings.API_WRITE_SLOTS = 2
    answers: dict = {}
    threads = [post_in_thread("/hold/", n, answers) for n in (1, 2)]
    assert {entered.get(timeout=5), entered.get(timeout=5)} == {1, 2}
    go.set()
    for thread in threads:
        thread.join(5)
    assert {a.status_code for a in answers.values()} == {200}


def test_a_write_that_waits_too_long_is_a_503_with_retry_after(settings):
    settings.API_WRITE_SLOTS, settings.API_WRITE_WAIT_S = 1, 0.2
    answers: dict = {}
    holder = post_in_thread("/hold/", 1, answers)
    assert entered.get(timeout=5) == 1
    refused = Client().post("/hold/", {"n": 2}, content_type="application/json")
    assert refused.status_code == 503
    assert refused["Retry-After"] == "1"
    assert "TOPOWEB_API_WRITE_SLOTS" in refused.json()["detail"]
    assert entered.empty()  # the refused write never reached its view
    go.set()
    holder.join(5)
    assert answers[1].status_code == 200


def test_a_slot_comes_back_after_the_view_raises(settings):
    settings.API_WRITE_SLOTS, settings.API_WRITE_WAIT_S = 1, 0.5
    failed = Client(raise_request_exception=False).post(
        "/hold/", {"n": 1, "fail": True}, content_type="application/json"
    )
    assert failed.status_code == 500
    go.set()
    assert Client().post("/hold/", {"n": 2}, content_type="application/json").status_code == 200


def test_exempt_views_and_no_limit_do_not_wait(settings):
    settings.API_WRITE_SLOTS, settings.API_WRITE_WAIT_S = 1, 0.2
    answers: dict = {}
    holder = post_in_thread("/hold/", 1, answers)
    assert entered.get(timeout=5) == 1
    exempt = post_in_thread("/exempt/", 2, answers)
    assert entered.get(timeout=5) == 2  # beside the held slot
    settings.API_WRITE_SLOTS = 0
    unlimited = post_in_thread("/hold/", 3, answers)
    assert entered.get(timeout=5) == 3
    go.set()
    for thread in (holder, exempt, unlimited):
        thread.join(5)
    assert {a.status_code for a in answers.values()} == {200}


def test_the_agents_long_poll_holds_no_slot():
    assert AgentSyncView.write_slot is False


def test_work_left_until_the_slot_is_free_runs_once_it_is(settings, caplog):
    settings.API_WRITE_SLOTS = 1
    after.clear()
    assert Client().post("/after/", {"n": 1}, content_type="application/json").status_code == 200
    assert after == [(1, "view"), (1, True)]  # after the view, with the slot free, before the answer
    # Work that raises is logged; the answer stands.
    assert Client().post("/after/", {"n": 2}, content_type="application/json").status_code == 200
    assert after[2:] == [(2, "view"), (2, True)]
    assert "work after a write slot failed" in caplog.text
    # A request that holds no slot runs it at once.
    assert Client().get("/after/").status_code == 200
    assert after[4:] == [(0, True), (0, "view")]


def test_a_slot_lent_during_a_wait_goes_to_the_next_write_and_comes_back_after_it(settings):
    settings.API_WRITE_SLOTS, settings.API_WRITE_WAIT_S = 1, 5
    lend_go.clear()
    answers: dict = {}
    lender = threading.Thread(
        target=lambda: answers.setdefault(
            "lend", Client().post("/lend/", {}, content_type="application/json")
        )
    )
    lender.start()
    assert lent.get(timeout=5) == "lent"
    other = post_in_thread("/hold/", 1, answers)
    assert entered.get(timeout=5) == 1  # the next write runs while the slot is lent
    lend_go.set()
    with pytest.raises(queue.Empty):
        lent.get(timeout=0.3)  # the lender waits for the slot to come back
    go.set()
    assert lent.get(timeout=5) == "back"
    for thread in (lender, other):
        thread.join(5)
    assert answers["lend"].status_code == answers[1].status_code == 200
    # The slot is whole again: one write at a time.
    assert slot_free()
