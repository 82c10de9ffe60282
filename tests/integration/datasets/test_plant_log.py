"""Plant logs in CSV and Parquet with a YAML schema: episodes, signals, card and errors."""

from __future__ import annotations

import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from neorl_industrial.integration.datasets import (
    DatasetFormatError,
    load_any,
    load_native,
    load_plant_log,
    save_native,
)

SCHEMA = """\
name: boiler-3
timestamp: time
sampling_period: 60
observations:
  - {column: temperature, unit: degC, bounds: [0, 500]}
  - pressure
actions:
  - {column: valve, unit: "%", bounds: [0, 100]}
reward: -abs(temperature - 350) - 0.01 * valve
costs:
  - {name: overheating, expression: "max(temperature - 420, 0)", limit: 5.0}
  - {name: alarm}
"""

# Two stretches of four rows, 60 s apart (one step 80 s: within 1.5 x 60 s), then a gap.
SECONDS = [0, 60, 140, 200, 900, 960, 1020, 1080]
TEMPERATURE = [340.0, 355.0, 430.0, 400.0, 350.0, 351.5, 349.0, 425.0]
PRESSURE = [1.0, 1.1, 1.2, 1.3, 2.0, 2.1, 2.2, 2.3]
VALVE = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0]
ALARM = [0, 0, 1, 0, 0, 0, 0, 1]


def _table(**changes):
    columns = {
        "time": pa.array(np.datetime64("2024-03-01T08:00:00", "s") + np.asarray(SECONDS)),
        "temperature": TEMPERATURE,
        "pressure": PRESSURE,
        "valve": VALVE,
        "alarm": ALARM,
        "operator": ["ann"] * 8,  # not used by the schema: ignored
    }
    columns.update(changes)
    return pa.table(columns)


def _write(tmp_path, table, kind="csv", schema=SCHEMA):
    table_path = tmp_path / f"log.{kind}"
    if kind == "csv":
        pcsv.write_csv(table, table_path)
    else:
        pq.write_table(table, table_path)
    schema_path = tmp_path / "schema.yaml"
    schema_path.write_text(textwrap.dedent(schema))
    return table_path, schema_path


def _expected_reward(rows):
    temperature, valve = np.asarray(TEMPERATURE)[rows], np.asarray(VALVE)[rows]
    return -np.abs(temperature - 350) - 0.01 * valve


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_log_becomes_episodes_split_at_the_gap(tmp_path, kind):
    dataset, _ = load_plant_log(*_write(tmp_path, _table(), kind))
    assert dataset.episode_lengths.tolist() == [3, 3]
    np.testing.assert_allclose(
        dataset.observations, np.stack([TEMPERATURE, PRESSURE], axis=1), rtol=1e-6
    )
    np.testing.assert_allclose(dataset.actions[:, 0], [10, 20, 30, 50, 60, 70])
    np.testing.assert_allclose(dataset.rewards, _expected_reward([0, 1, 2, 4, 5, 6]), rtol=1e-6)
    np.testing.assert_allclose(dataset.costs[:, 0], [0, 0, 10, 0, 0, 0], atol=1e-4)
    np.testing.assert_allclose(dataset.costs[:, 1], [0, 0, 1, 0, 0, 0])
    assert dataset.timeouts.tolist() == [False, False, True] * 2
    assert not dataset.terminals.any()


def test_an_alarm_defined_at_a_threshold_is_one_where_the_reading_is_above_it(tmp_path):
    schema = SCHEMA.replace("  - {name: alarm}", '  - {name: hot, expression: "temperature > 420"}')
    dataset, card = load_plant_log(*_write(tmp_path, _table(), schema=schema))
    # Rows 0, 1, 2 and 4, 5, 6 make transitions; only row 2 (430 degC) is above 420.
    np.testing.assert_array_equal(dataset.costs[:, 1], [0, 0, 1, 0, 0, 0])
    assert card.definitions["hot"] == "temperature > 420"


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_card_carries_units_bounds_definitions_and_limits(tmp_path, kind):
    _, card = load_plant_log(*_write(tmp_path, _table(), kind))
    assert card.name == "boiler-3" and card.source == "plant-log"
    assert card.sampling_period == 60
    temperature, pressure = card.observation_columns
    assert (temperature.name, temperature.unit, temperature.bounds) == (
        "temperature",
        "degC",
        (0, 500),
    )
    assert (pressure.unit, pressure.bounds) == (None, None)
    assert card.action_columns[0].bounds == (0, 100) and card.action_columns[0].unit == "%"
    assert card.cost_names == ["overheating", "alarm"]
    assert card.cost_limits == {"overheating": 5.0}
    assert card.definitions["reward"] == "-abs(temperature - 350) - 0.01 * valve"
    assert card.definitions["alarm"] == "alarm"
    assert card.sizes.n_transitions == 6 and card.sizes.n_costs == 2


def test_episode_and_terminal_columns_with_numeric_seconds(tmp_path):
    schema = SCHEMA + "episode: batch\nterminal: tripped\nreward_row: next\n"
    table = _table(
        time=[0.0, 60.0, 120.0, 180.0, 0.0, 60.0, 120.0, 180.0],  # time restarts per batch
        batch=["a"] * 4 + ["b"] * 4,
        tripped=[False, False, True, False, False, False, False, False],
    )
    # Batch a ends at the trip (row 2); row 3 alone makes no transition; batch b is whole.
    with pytest.warns(UserWarning, match="skipped 1 isolated row"):
        dataset, _ = load_plant_log(*_write(tmp_path, table, "parquet", schema))
    assert dataset.episode_lengths.tolist() == [2, 3]
    assert dataset.terminals.tolist() == [False, True, False, False, False]
    assert dataset.timeouts.tolist() == [False, False, False, False, True]
    # reward_row: next evaluates transition t's reward on row t + 1.
    np.testing.assert_allclose(dataset.rewards, _expected_reward([1, 2, 5, 6, 7]), rtol=1e-6)


def test_isolated_rows_are_skipped_with_a_warning(tmp_path):
    seconds = [0, 60, 120, 1000, 2000, 2060]
    table = _table(
        time=pa.array(np.asarray(seconds, np.float64)),
        temperature=TEMPERATURE[:6],
        pressure=PRESSURE[:6],
        valve=VALVE[:6],
        alarm=ALARM[:6],
        operator=["ann"] * 6,
    )
    with pytest.warns(UserWarning, match="skipped 1 isolated row"):
        dataset, _ = load_plant_log(*_write(tmp_path, table))
    assert dataset.episode_lengths.tolist() == [2, 1]


# ----- bad input ---------------------------------------------------------------------------
def test_a_missing_column_is_named_with_the_columns_that_exist(tmp_path):
    schema = SCHEMA.replace("0.01 * valve", "0.01 * valve_position")
    table_path, _ = _write(tmp_path, _table(), schema=schema)
    with pytest.raises(DatasetFormatError) as caught:
        load_plant_log(table_path, tmp_path / "schema.yaml")
    message = str(caught.value)
    assert message.startswith(f"{table_path}: column 'valve_position': not in the file")
    assert "schema.yaml uses it (reward)" in message
    assert "time, temperature, pressure, valve, alarm, operator" in message


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("csv", np.nan, "column 'pressure', row 5: missing value"),
        ("csv", np.inf, "column 'pressure', row 5: inf is not a finite number"),
        ("parquet", np.nan, "column 'pressure', row 5: nan is not a finite number"),
    ],
)
def test_nan_and_inf_name_file_column_and_row(tmp_path, kind, value, message):
    pressure = list(PRESSURE)
    pressure[5] = value
    table_path, schema_path = _write(tmp_path, _table(pressure=pressure), kind)
    with pytest.raises(DatasetFormatError, match=message) as caught:
        load_plant_log(table_path, schema_path)
    assert caught.value.path == str(table_path)
    assert (caught.value.column, caught.value.row) == ("pressure", 5)


def test_timestamps_out_of_order_name_the_row(tmp_path):
    seconds = list(SECONDS)
    seconds[3] = 100  # before row 2 (140 s)
    table = _table(time=pa.array(np.datetime64("2024-03-01T08:00:00", "s") + np.asarray(seconds)))
    with pytest.raises(
        DatasetFormatError, match=r"column 'time', row 3: timestamp .* is not after"
    ):
        load_plant_log(*_write(tmp_path, table))


def test_unparseable_timestamp_names_the_row(tmp_path):
    stamps = [f"2024-03-01T08:{m:02d}:00" for m in range(8)]
    stamps[6] = "yesterday"
    with pytest.raises(
        DatasetFormatError, match="column 'time', row 6: 'yesterday' is not an ISO 8601"
    ):
        load_plant_log(*_write(tmp_path, _table(time=stamps), "parquet"))


def test_action_outside_its_bounds_names_column_row_value_and_bounds(tmp_path):
    valve = list(VALVE)
    valve[2] = 120.0
    with pytest.raises(
        DatasetFormatError,
        match=r"column 'valve', row 2: action 120.0 is outside the declared bounds \[0.0, 100.0\]",
    ):
        load_plant_log(*_write(tmp_path, _table(valve=valve)))


def test_a_reward_that_is_not_finite_names_the_row(tmp_path):
    schema = SCHEMA.replace(
        "reward: -abs(temperature - 350) - 0.01 * valve", "reward: log(temperature - 345)"
    )
    with pytest.raises(DatasetFormatError, match=r"row 0: reward = log\(temperature - 345\)"):
        load_plant_log(*_write(tmp_path, _table(), schema=schema))


def test_episode_ids_must_not_come_back(tmp_path):
    schema = SCHEMA + "episode: batch\n"
    table = _table(batch=["a", "a", "b", "b", "a", "a", "c", "c"])
    with pytest.raises(DatasetFormatError, match="column 'batch', row 4: episode 'a' appears"):
        load_plant_log(*_write(tmp_path, table, schema=schema))


@pytest.mark.parametrize(
    ("schema", "field", "complaint"),
    [
        (SCHEMA.replace(", bounds: [0, 100]}", "}"), "actions[0].bounds", "Field required"),
        (SCHEMA.replace("sampling_period: 60", "sampling_period: -60"), "sampling_period", ""),
        (
            SCHEMA.replace("observations:", "observation:"),
            "observation",
            "unknown field 'observation'; did you mean 'observations'?",
        ),
        (
            SCHEMA.replace("unit: degC,", "units: degC,"),
            "observations[0].units",
            "unknown field 'units'; did you mean 'unit'?",
        ),
        (
            SCHEMA.replace("gap_factor", "gap_factr").replace(
                "sampling_period: 60", "sampling_period: 60\ngap_factr: 2"
            ),
            "gap_factr",
            "did you mean 'gap_factor'?",
        ),
        (SCHEMA.replace("bounds: [0, 500]", "bounds: [500, 0]"), "observations[0].bounds", ""),
        (
            SCHEMA.replace("bounds: [0, 500]", "physical: [0, 500], bounds: [0, 500]"),
            "observations[0]",
            "give 'physical' (the sensor's range) only",
        ),
        (
            SCHEMA.replace("bounds: [0, 500]", "physical: [.nan, 500]"),
            "observations[0].physical",
            "has NaN; write .inf or -.inf for an open side",
        ),
        (
            SCHEMA.replace("bounds: [0, 100]", "bounds: [0, .inf]"),
            "actions[0].bounds",
            "an action's bounds must be finite numbers",
        ),
        (
            SCHEMA.replace("limit: 5.0", "limit: .nan"),
            "costs[0].limit",
            "must be a finite number in [0, 1e+12], got nan; for no limit, leave 'limit' out",
        ),
        (
            SCHEMA.replace("limit: 5.0", "limit: .inf"),
            "costs[0].limit",
            "must be a finite number in [0, 1e+12], got inf; for no limit, leave 'limit' out",
        ),
    ],
)
def test_schema_errors_name_the_schema_file_and_field(tmp_path, schema, field, complaint):
    table_path, schema_path = _write(tmp_path, _table(), schema=schema)
    with pytest.raises(DatasetFormatError) as caught:
        load_plant_log(table_path, schema_path)
    message = str(caught.value)
    assert message.startswith(f"{schema_path}: invalid plant-log schema: ")
    assert "\n" not in message  # one line, however many errors
    assert f" {field}: " in message and complaint in message, message


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('true')", "temperature.real", "[temperature][0]", "valve == 3"],
)
def test_expressions_outside_the_language_are_rejected(tmp_path, expression):
    schema = SCHEMA.replace(
        "reward: -abs(temperature - 350) - 0.01 * valve", f'reward: "{expression}"'
    )
    table_path, schema_path = _write(tmp_path, _table(), schema=schema)
    with pytest.raises(DatasetFormatError, match=r"reward: .* is not allowed") as caught:
        load_plant_log(table_path, schema_path)
    assert str(caught.value).startswith(str(schema_path))


def test_load_any_needs_the_schema_for_a_plant_log(tmp_path):
    table_path, schema_path = _write(tmp_path, _table())
    with pytest.raises(DatasetFormatError, match="needs its YAML schema"):
        load_any(table_path)
    dataset, card = load_any(table_path, schema=schema_path)
    assert dataset.n_transitions == 6 and card.source == "plant-log"


def test_a_missing_value_names_file_column_and_row_and_the_way_out(tmp_path):
    pressure = [*PRESSURE[:5], None, *PRESSURE[6:]]
    table_path, schema_path = _write(tmp_path, _table(pressure=pressure))
    with pytest.raises(DatasetFormatError, match=r"log.csv: column 'pressure', row 5: missing"):
        load_plant_log(table_path, schema_path)
    with pytest.raises(DatasetFormatError, match="missing: drop"):
        load_plant_log(table_path, schema_path)


@pytest.mark.parametrize("missing", ["drop", "split"])
def test_rows_with_missing_values_can_be_dropped(tmp_path, missing):
    # Row 5 (960 s) loses its pressure reading: without it 900 -> 1020 s is a 120 s gap,
    # more than 1.5 x 60 s, so row 4 stands alone (skipped) and 1020, 1080 s remain.
    pressure = [*PRESSURE[:5], None, *PRESSURE[6:]]
    table_path, schema_path = _write(tmp_path, _table(pressure=pressure))
    with pytest.warns(UserWarning, match="dropped 1 row"):
        dataset, card = load_plant_log(table_path, schema_path, missing=missing)
    assert [int(n) for n in np.asarray(dataset.episode_lengths)] == [3, 1]
    assert card.dropped_rows == 1 and card.missing == missing
    np.testing.assert_allclose(
        np.asarray(dataset.observations)[:, 1], [*PRESSURE[:4], *PRESSURE[6:]], rtol=1e-6
    )


def test_split_starts_an_episode_after_a_dropped_row_that_the_gap_rule_keeps(tmp_path):
    # One-second sampling with a wide gap factor: dropping row 2 leaves a 2 s step, which
    # the gap rule keeps in the episode; 'split' starts a new one there anyway.
    seconds = [0, 1, 2, 3, 4, 5, 6, 7]
    schema = SCHEMA.replace("sampling_period: 60", "sampling_period: 1\ngap_factor: 3")
    temperature = [*TEMPERATURE[:2], float("nan"), *TEMPERATURE[3:]]
    table = _table(
        time=pa.array(np.datetime64("2024-03-01T08:00:00", "s") + np.asarray(seconds)),
        temperature=temperature,
    )
    table_path, schema_path = _write(tmp_path, table, kind="parquet", schema=schema)
    with pytest.warns(UserWarning):
        kept, _ = load_plant_log(table_path, schema_path, missing="drop")
    with pytest.warns(UserWarning):
        split, _ = load_plant_log(table_path, schema_path, missing="split")
    assert [int(n) for n in np.asarray(kept.episode_lengths)] == [6]
    assert [int(n) for n in np.asarray(split.episode_lengths)] == [1, 4]


def test_the_card_of_a_plant_log_is_its_task(tmp_path):
    table_path, schema_path = _write(tmp_path, _table())
    dataset, card = load_plant_log(table_path, schema_path)
    task = card.task(dataset)
    assert task.name == "boiler-3" and not task.has_simulator
    assert task.observation_names == ("temperature", "pressure")
    assert task.observation_units == ("degC", None)
    assert (task.action_low, task.action_high, task.action_units) == ((0.0,), (100.0,), ("%",))
    assert task.cost_names == ("overheating", "alarm")
    assert task.cost_limits == {"overheating": 5.0}
    assert task.cost_definitions["overheating"] == "max(temperature - 420, 0)"
    assert task.sampling_period == 60.0
    assert task.exogenous == ()
    # A measured disturbance no action moves is marked so, on the card and the task.
    schema = SCHEMA.replace("  - pressure\n", "  - {column: pressure, exogenous: true}\n")
    table_path, schema_path = _write(tmp_path, _table(), schema=schema)
    dataset, card = load_plant_log(table_path, schema_path)
    assert [c.exogenous for c in card.observation_columns] == [False, True]
    assert card.task(dataset).exogenous == ("pressure",)


def test_history_stacks_the_last_rows_newest_first_and_names_them(tmp_path):
    schema = SCHEMA.replace("  - pressure\n", "  - {column: pressure, exogenous: true}\n")
    table_path, schema_path = _write(tmp_path, _table(), schema=schema + "history: 3\n")
    dataset, card = load_plant_log(table_path, schema_path)
    assert dataset.frame_stack == 3 and dataset.observation_size == 6
    rows = np.stack([TEMPERATURE, PRESSURE], axis=1)
    # Episode 1 is rows 0-3, episode 2 rows 4-7: before an episode's first row, its
    # history repeats that row; the rows themselves are stored once.
    expected = [
        np.concatenate([rows[t], rows[max(t - 1, first)], rows[max(t - 2, first)]])
        for first, stop in ((0, 3), (4, 7))
        for t in range(first, stop)
    ]
    np.testing.assert_allclose(dataset.transition_observations(), expected, rtol=1e-6)
    assert dataset.observations.shape == (8 + 2 * 2, 2)
    task = card.task(dataset)
    assert task.observation_names == (
        "temperature", "pressure",
        "temperature@t-1", "pressure@t-1",
        "temperature@t-2", "pressure@t-2",
    )  # fmt: skip
    assert task.observation_units == ("degC", None) * 3
    assert task.observation_high == (500.0, np.inf) * 3
    # Only the newest row's disturbance is the plant model's to take from the log.
    assert task.exogenous == ("pressure",)
    task.check_dataset(dataset, card=card)
    # The stacked dataset saves and loads as it was.
    save_native(dataset, tmp_path / "native", card=card)
    again, again_card = load_native(tmp_path / "native")
    assert again.frame_stack == 3
    np.testing.assert_array_equal(
        again.transition_observations(), dataset.transition_observations()
    )
    assert again_card.task(again).observation_names == task.observation_names


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("0", "greater than or equal to 1"),
        ("65", "less than or equal to 64"),
        ("2.5", "valid integer"),
        ('"3"', "valid integer"),
        ("true", "valid integer"),
    ],
)
def test_a_history_outside_1_to_64_rows_names_the_field(tmp_path, value, complaint):
    schema = SCHEMA + f"history: {value}\n"
    table_path, schema_path = _write(tmp_path, _table(), schema=schema)
    with pytest.raises(DatasetFormatError, match=r"invalid plant-log schema: history: ") as caught:
        load_plant_log(table_path, schema_path)
    assert complaint in str(caught.value), str(caught.value)


def test_a_history_given_to_the_loader_replaces_the_schema_s(tmp_path):
    """``load_plant_log(..., history=H)`` (what ``model history`` compares) reads the log as
    if the schema said ``history: H``; the schema file stays as it was."""
    table_path, schema_path = _write(tmp_path, _table(), schema=SCHEMA + "history: 3\n")
    written = schema_path.read_text()
    stacked, _ = load_plant_log(table_path, schema_path)
    one, one_card = load_plant_log(table_path, schema_path, history=1)
    two, _ = load_plant_log(table_path, schema_path, history=2)
    assert (one.frame_stack, two.frame_stack, stacked.frame_stack) == (1, 2, 3)
    np.testing.assert_array_equal(
        two.transition_observations(), stacked.transition_observations()[:, :4]
    )
    assert one_card.task(one).observation_names == ("temperature", "pressure")
    assert schema_path.read_text() == written
    for bad in (0, 65, 2.5, True, "3"):
        with pytest.raises(DatasetFormatError, match="history: expected a whole number from 1"):
            load_plant_log(table_path, schema_path, history=bad)


# ----- untrusted files ---------------------------------------------------------------------
ALIAS_BOMB = """\
a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_a_schema_with_an_alias_bomb_is_refused_at_once_naming_file_and_line(tmp_path):
    table_path, schema_path = _write(tmp_path, _table(), schema=ALIAS_BOMB)
    with pytest.raises(DatasetFormatError, match=r"anchors \(&name\) are not accepted") as caught:
        load_plant_log(table_path, schema_path)
    message = str(caught.value)
    assert message.startswith(f"{schema_path}: not valid YAML") and "line 1" in message
    assert caught.value.path == str(schema_path)


def test_a_schema_over_one_mebibyte_is_not_read(tmp_path):
    table_path, schema_path = _write(tmp_path, _table(), schema=SCHEMA + "#" * (1 << 20))
    with pytest.raises(DatasetFormatError, match=r"schema.yaml: larger than 1048576 bytes"):
        load_plant_log(table_path, schema_path)


def test_a_missing_schema_names_the_file(tmp_path):
    table_path, _ = _write(tmp_path, _table())
    with pytest.raises(DatasetFormatError, match=r"nothere.yaml: cannot read the plant-log schema"):
        load_plant_log(table_path, tmp_path / "nothere.yaml")


@pytest.mark.parametrize(
    ("field", "expression", "complaint"),
    [
        ("reward", "1" + "0" * 400, "401-digit number literal is larger than a float64"),
        ("reward", "-" * 990 + "valve", "nested 990 levels deep"),
        ("costs 'overheating'", "(" * 300 + "valve" + ")" * 300, "nested 300 levels deep"),
        ("reward", "temperature.__class__", "is not allowed"),
        ("reward", "open(valve)", "is not allowed"),
        ("reward", "(lambda: 0)()", "is not allowed"),
    ],
)
def test_hostile_expressions_name_the_schema_and_field(tmp_path, field, expression, complaint):
    if field == "reward":
        schema = SCHEMA.replace(
            "reward: -abs(temperature - 350) - 0.01 * valve", f'reward: "{expression}"'
        )
    else:
        schema = SCHEMA.replace('"max(temperature - 420, 0)"', f'"{expression}"')
    table_path, schema_path = _write(tmp_path, _table(), schema=schema)
    with pytest.raises(DatasetFormatError, match=complaint) as caught:
        load_plant_log(table_path, schema_path)
    assert str(caught.value).startswith(f"{schema_path}: {field}: ")


def test_a_text_value_in_a_number_column_names_column_and_row(tmp_path):
    pressure = [str(value) for value in PRESSURE]
    pressure[6] = "n/a (sensor)"
    table_path, schema_path = _write(tmp_path, _table(pressure=pressure))
    with pytest.raises(DatasetFormatError) as caught:
        load_plant_log(table_path, schema_path)
    assert (caught.value.column, caught.value.row) == ("pressure", 6)
    assert str(caught.value) == (
        f"{table_path}: column 'pressure', row 6: invalid value 'n/a (sensor)', expected a number"
    )


def test_a_text_value_far_down_a_long_csv_names_its_row(tmp_path):
    n_rows = 50_000
    table = _table(
        time=np.arange(n_rows, dtype=np.float64) * 60,
        temperature=np.full(n_rows, 350.0),
        pressure=np.full(n_rows, 1.0),
        valve=np.full(n_rows, 10.0),
        alarm=np.zeros(n_rows, np.int64),
        operator=["ann"] * n_rows,
    )
    table_path, schema_path = _write(tmp_path, table)
    lines = table_path.read_text().splitlines()
    lines[1 + 41_234] = lines[1 + 41_234].replace(",10,", ",ten,", 1)
    table_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetFormatError, match="column 'valve', row 41234: invalid value 'ten'"):
        load_plant_log(table_path, schema_path)


def test_a_row_with_too_few_fields_names_the_row(tmp_path):
    table_path, schema_path = _write(tmp_path, _table())
    lines = table_path.read_text().splitlines()
    lines[1 + 3] = lines[1 + 3].rsplit(",", 2)[0]
    table_path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        DatasetFormatError, match=r"log.csv: row 3: 4 field\(s\) where the header has 6"
    ):
        load_plant_log(table_path, schema_path)


def test_a_terminal_column_of_words_names_the_row(tmp_path):
    schema = SCHEMA + "terminal: tripped\n"
    tripped = ["0", "0", "0", "yes", "0", "0", "0", "0"]
    with pytest.raises(DatasetFormatError, match="column 'tripped', row 3: 'yes' is not a number"):
        load_plant_log(*_write(tmp_path, _table(tripped=tripped), "parquet", schema))


# ----- physical range vs the data's range ---------------------------------------------
def test_a_reading_outside_the_physical_range_is_an_invalid_reading(tmp_path):
    temperature = [*TEMPERATURE[:5], 612.0, *TEMPERATURE[6:]]  # the sensor reads 0..500
    schema = SCHEMA.replace("bounds: [0, 500]", "physical: [0, 500]")
    table_path, schema_path = _write(tmp_path, _table(temperature=temperature), schema=schema)
    with pytest.raises(DatasetFormatError) as caught:
        load_plant_log(table_path, schema_path)
    assert (caught.value.column, caught.value.row) == ("temperature", 5)
    assert "reading 612.0 is outside the sensor's physical range [0.0, 500.0]" in str(caught.value)
    assert "missing: drop" in str(caught.value)
    # Dropped like a missing value on request (row 5 goes; see the missing-value test).
    with pytest.warns(UserWarning, match="dropped 1 row"):
        dataset, card = load_plant_log(table_path, schema_path, missing="drop")
    assert card.dropped_rows == 1
    assert float(np.max(np.asarray(dataset.observations)[:, 0])) <= 500.0


def test_the_card_records_the_data_range_and_the_task_flags_outside_it(tmp_path):
    table_path, schema_path = _write(tmp_path, _table())
    dataset, card = load_plant_log(table_path, schema_path)
    temperature, pressure = card.observation_columns
    # The physical range is the schema's; the observed one is what the episodes span
    # (row 7, 425 degC, ends the last episode; every row is in an episode here).
    assert temperature.bounds == (0, 500)
    assert temperature.observed == (min(TEMPERATURE), max(TEMPERATURE))
    assert pressure.bounds is None and pressure.observed == (min(PRESSURE), max(PRESSURE))
    task = card.task(dataset)
    assert task.data_low == (min(TEMPERATURE), min(PRESSURE))
    from neorl_industrial.core.safety import ConstraintSpec, shield

    spec = ConstraintSpec.from_dict({"action_bounds": {"valve": [0, 100]}})
    compiled = task.compile_constraints(spec)
    inside = np.asarray([400.0, 1.5], np.float32)
    hotter = np.asarray([480.0, 1.5], np.float32)  # above the data, below physics
    broken = np.asarray([520.0, 1.5], np.float32)  # above physics
    action, prev = np.asarray([50.0], np.float32), np.asarray([50.0], np.float32)
    _, report = shield(compiled, inside, action, prev)
    assert int(report.status) == 0
    safe, report = shield(compiled, hotter, action, prev)
    assert bool(report.out_of_distribution) and not bool(report.overridden)
    assert float(safe[0]) == 50.0
    _, report = shield(compiled, broken, action, prev)
    assert bool(report.invalid_observation) and bool(report.fallback)


def test_a_latin1_header_names_the_file_and_the_encoding(tmp_path):
    table_path, schema_path = _write(tmp_path, _table())
    text = table_path.read_text().replace("pressure", "pression_\u00e9", 1)
    table_path.write_bytes(text.encode("latin-1"))
    with pytest.raises(DatasetFormatError) as caught:
        load_plant_log(table_path, schema_path)
    message = str(caught.value)
    assert message.startswith(f"{table_path}: the header is not UTF-8 text (byte 0xe9")
    assert "save the file as UTF-8" in message


def test_a_huge_cell_is_quoted_short(tmp_path):
    pressure = [str(value) for value in PRESSURE]
    pressure[3] = "x" * 20_000_000
    table_path, schema_path = _write(tmp_path, _table(pressure=pressure), "parquet")
    with pytest.raises(DatasetFormatError) as caught:
        load_plant_log(table_path, schema_path)
    message = str(caught.value)
    assert len(message) < 1_000
    assert (caught.value.column, caught.value.row) == ("pressure", 3)
    assert "(20000000 characters)" in message


@pytest.mark.parametrize("stated", [None, "current", "next"])
def test_the_card_records_the_row_reward_and_costs_were_evaluated_on(tmp_path, stated):
    schema = SCHEMA if stated is None else SCHEMA + f"reward_row: {stated}\n"
    dataset, card = load_plant_log(*_write(tmp_path, _table(), schema=schema))
    assert card.reward_row == (stated or "current")  # the schema's default is row t
    # The native copy keeps it, so a plant model needs no schema to know the row.
    save_native(dataset, tmp_path / "native", card)
    _, loaded = load_native(tmp_path / "native")
    assert loaded.reward_row == card.reward_row
