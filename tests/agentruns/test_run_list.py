"""The run list: states in words, grouped, with counts; the marks on each row and the
filters by them; raw state names still in the URL and the API."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import ApiToken
from agentruns.models import Run, RunStatus
from agentruns.runtime import faults
from agentruns.states import STATES

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def viewer(client, tenant, make_operator):
    client.force_login(make_operator(tenant, "viewer"))
    return client


def _listed(page: str) -> set[str]:
    return set(re.findall(r'<tr id="run-([0-9a-f-]{36})"', page))


def _tab(page: str, label: str) -> str:
    """The count a tab shows, by its label."""
    found = re.search(re.escape(label) + r' <span class="count">([^<]*)</span>', page)
    assert found, f"no tab {label!r}"
    return found.group(1)


@pytest.fixture
def runs(harness, provider):
    """One run in each group, and marks on the way: a plain completed run, a retried one,
    a recovered one, a compensated one, one waiting for a person and one asleep."""
    plain = harness.drive(harness.start("flow", {"order_id": "plain"}))
    provider.script["lookup_order"] = ["fail_before"]
    retried = harness.drive(harness.start("flow", {"order_id": "retried"}))
    recovered = harness.start("flow", {"order_id": "recovered"})
    harness.interrupt(recovered, faults.AFTER_RESULT_RECORDED, "lookup_order")
    recovered = harness.drive(recovered)
    compensated = harness.start("flow", {"order_id": "undone", "fail_after_charge": True})
    harness.advance(compensated)
    provider.script["send_email"] = ["fail_after"]
    unknown = harness.start("mailer")
    harness.advance(unknown)
    asleep = harness.start("flow", {"order_id": "asleep", "sleep": 600})
    harness.advance(asleep)
    found = {
        name: Run.objects.get(pk=run.id)
        for name, run in [
            ("plain", plain),
            ("retried", retried),
            ("recovered", recovered),
            ("compensated", compensated),
            ("unknown", unknown),
            ("asleep", asleep),
        ]
    }
    assert [found[n].status for n in found] == [
        "completed",
        "completed",
        "completed",
        "compensated",
        "effect_unknown_reconciliation_required",
        "sleeping",
    ]
    return found


def test_every_state_has_its_tab_in_words_with_its_explanation_and_raw_name(viewer, runs):
    page = viewer.get("/runs/").content.decode()
    for status in RunStatus:
        state = STATES[status.value]
        assert f'href="/runs/?state={status.value}"' in page
        assert f'title="{state.explanation}"' in page.replace("&#x27;", "'")
    assert "effect_unknown_reconciliation_required <span" not in page  # no raw tab label
    assert _tab(page, "Outcome unknown — needs reconciliation") == "1"
    assert _tab(page, "Cancelled after an irreversible effect") == "0"


def test_the_tabs_group_states_with_a_total_per_group(viewer, runs):
    page = viewer.get("/runs/").content.decode()
    assert _tab(page, "All") == "6"
    assert _tab(page, "Needs a person") == "1"
    assert _tab(page, "Working") == "1"
    assert _tab(page, "Ended") == "4"
    assert _tab(page, "Completed") == "3"
    assert _tab(page, "Compensated") == "1"
    assert _tab(page, "Sleeping") == "1"
    # The groups in the order an operator looks: who waits for a person first.
    order = [page.index(f'id="tab-group-{slug}"') for slug in ("needs_person", "working", "ended")]
    assert order == sorted(order)
    needs_person = page[page.index('id="tab-group-needs_person"') : order[1]]
    for label in ["Waiting for approval", "Outcome unknown — needs reconciliation", "Blocked"]:
        assert label in needs_person


def test_a_group_tab_lists_the_runs_of_its_states(viewer, runs):
    page = viewer.get("/runs/", {"group": "ended"}).content.decode()
    ended = {"plain", "retried", "recovered", "compensated"}
    assert _listed(page) == {str(runs[name].id) for name in ended}
    assert 'class="group-tab active" aria-current="page">Ended' in page
    page = viewer.get("/runs/", {"group": "needs_person"}).content.decode()
    assert _listed(page) == {str(runs["unknown"].id)}
    # A state tab wins over a group; an unknown group is all runs.
    page = viewer.get("/runs/", {"group": "ended", "state": "sleeping"}).content.decode()
    assert _listed(page) == {str(runs["asleep"].id)}
    assert len(_listed(viewer.get("/runs/", {"group": "nonsense"}).content.decode())) == 6


def test_the_state_tab_keeps_the_raw_name_in_the_url_and_shows_words(viewer, runs):
    response = viewer.get("/runs/", {"state": "effect_unknown_reconciliation_required"})
    page = response.content.decode()
    assert _listed(page) == {str(runs["unknown"].id)}
    row = page[page.index(f'id="run-{runs["unknown"].id}"') :]
    assert (
        '<span class="state state-effect_unknown_reconciliation_required" '
        'title="Whether an effect happened is unknown; a reconciler finds out before the run '
        'goes on.">Outcome unknown — needs reconciliation<span class="visually-hidden">: '
    ) in row
    empty = viewer.get("/runs/", {"state": "blocked"}).content.decode()
    assert "No run is in the state <strong>Blocked</strong> right now." in empty


def test_the_api_still_speaks_raw_state_names(client, runs, tenant, make_operator):
    token = ApiToken.issue(owner=make_operator(tenant, "operator", username="olga"), name="t")[1]
    run = runs["unknown"]
    answer = client.get(f"/api/runs/{run.id}", HTTP_AUTHORIZATION=f"Bearer {token}").json()
    assert answer["status"] == "effect_unknown_reconciliation_required"


def test_a_row_shows_its_marks_as_labelled_links(viewer, runs):
    page = viewer.get("/runs/").content.decode()

    def row(name: str) -> str:
        start = page.index(f'<tr id="run-{runs[name].id}"')
        return page[start : page.index("</tr>", start)]

    assert 'class="mark mark-retried" href="/runs/?mark=retried"' in row("retried")
    assert 'title="A step took more than one attempt' in row("retried")
    assert ">recovered</a>" in row("recovered")
    assert ">compensated</a>" in row("compensated")
    assert 'class="marks"' not in row("plain")


@pytest.mark.parametrize("mark", ["retried", "recovered", "compensated"])
def test_a_mark_filter_lists_the_runs_so_marked_and_counts_under_it(viewer, runs, mark):
    page = viewer.get("/runs/", {"mark": mark}).content.decode()
    assert _listed(page) == {str(runs[mark].id)}
    assert _tab(page, "All") == "1"
    assert _tab(page, "Sleeping") == "0"
    assert f'<option value="{mark}" title="' in page and "selected>" + mark in page


def test_no_run_matches_a_mark_nobody_has(viewer, runs):
    for mark in ["reconciled", "approved"]:
        page = viewer.get("/runs/", {"mark": mark}).content.decode()
        assert _listed(page) == set()
        assert "No run matches these filters" in page


def test_a_mark_filter_combines_with_the_state_tab_and_the_other_filters(viewer, runs):
    retried = str(runs["retried"].id)
    assert _listed(viewer.get("/runs/?mark=retried&state=completed").content.decode()) == {retried}
    assert _listed(viewer.get("/runs/?mark=retried&state=sleeping").content.decode()) == set()
    assert _listed(viewer.get("/runs/?mark=retried&group=ended").content.decode()) == {retried}
    assert _listed(viewer.get("/runs/?mark=retried&agent=flow&q=retried").content.decode()) == {
        retried
    }
    assert _listed(viewer.get("/runs/?mark=retried&agent=mailer").content.decode()) == set()
    # The tab links keep the mark; an unknown mark filters nothing.
    page = viewer.get("/runs/?mark=retried").content.decode()
    assert 'href="/runs/?mark=retried&amp;state=completed"' in page
    assert len(_listed(viewer.get("/runs/?mark=everything").content.decode())) == 6


def test_the_list_costs_the_same_queries_however_many_rows_are_marked(viewer, harness, provider):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert viewer.get("/runs/").status_code == 200
        return len(captured.captured_queries)

    harness.drive(harness.start("flow"))
    few = queries()
    for i in range(6):
        provider.script["charge"] = ["fail_after"]  # sent twice: retried
        run = harness.start("flow", {"order_id": f"o-{i}", "fail_after_charge": True})
        harness.interrupt(run, faults.AFTER_RESULT_RECORDED, "lookup_order")
        harness.drive(run)
    marked = Run.objects.filter(retried=True, recovered=True, compensated=True)
    assert marked.count() == 6
    assert queries() == few


def test_every_tab_is_counted_in_one_statement_under_the_pages_filters(viewer, runs):
    with CaptureQueriesContext(connection) as captured:
        page = viewer.get("/runs/", {"agent": "flow", "mark": "retried"}).content.decode()
    counting = [q["sql"] for q in captured.captured_queries if "COUNT(" in q["sql"].upper()]
    tab_counts = [sql for sql in counting if '"agentruns_run"' in sql and "LIMIT" in sql]
    assert len(tab_counts) == 1  # the total and every state, in one round trip
    # The filters hold in each count: only the retried run is counted.
    assert _tab(page, "All") == "1"
    assert _tab(page, "Completed") == "1"
    assert _tab(page, "Sleeping") == "0"
