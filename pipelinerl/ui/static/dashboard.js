// The dashboard's pages, filled from the JSON API (/api/...) and refreshed every few seconds.
// Charts are plotly.js (served from the plotly Python package); nothing is fetched from elsewhere.
"use strict";

const Dashboard = (() => {
  // One colour per run on the compare page, the same in every chart (Plotly's qualitative set).
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  const PLOT_CONFIG = { displaylogo: false, responsive: true };
  // ESS lies in (0, 1]: a fixed axis shows 0.99 as nearly perfect instead of magnifying its noise.
  const ESS_AXIS = { yaxis: { range: [0, 1.05], title: { text: "ESS" } } };
  const EVAL_DASHES = ["dot", "dash", "dashdot", "longdash"];
  const RUNS_SHOWN = 500;  // newest first; the filters narrow older ones down
  const pollMs = () => Number(document.body.dataset.pollMs || 3000);

  // ----- fetching, with the banner that names what is unreachable -----

  class ApiError extends Error {
    constructor(status, detail) { super(detail); this.status = status; }
  }

  async function api(path) {
    let response;
    try {
      response = await fetch(path, { headers: { Accept: "application/json" } });
    } catch (error) {
      throw new ApiError(0, "the dashboard server is not reachable (" + error.message + ")");
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail || body);
      throw new ApiError(response.status, detail);
    }
    return body;
  }

  async function post(path, body) {
    let response;
    try {
      response = await fetch(path, {
        method: "POST", headers: { Accept: "application/json", "Content-Type": "application/json" }, body: JSON.stringify(body),
      });
    } catch (error) {
      throw new ApiError(0, "the dashboard server is not reachable (" + error.message + ")");
    }
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) {
      const detail = typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail || answer);
      throw new ApiError(response.status, detail);
    }
    return answer;
  }

  function banner(message) {
    const element = document.getElementById("banner");
    if (!message) { element.hidden = true; element.textContent = ""; return; }
    element.hidden = false;
    element.textContent = message + " — retrying every " + Math.round(pollMs() / 1000) + " s";
  }

  // Run ``refresh`` now and every poll interval; errors go to the banner and the polling goes on.
  function poll(refresh) {
    let stopped = false;
    const tick = async () => {
      try {
        const keepGoing = await refresh();
        banner(null);
        if (keepGoing === false) { stopped = true; }
      } catch (error) {
        if (error.status === 404) { document.querySelector("main").innerHTML = "<h1>Not found</h1><p class='not-found'>" + escapeHtml(error.message) + "</p>"; return; }
        banner(error.status === 503 ? "Platform database unreachable: " + error.message : error.message);
      }
      if (!stopped) { setTimeout(tick, pollMs()); }
    };
    tick();
  }

  // ----- formatting -----

  function escapeHtml(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  const num = (value, digits = 3) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return h ? `${h}h ${String(m).padStart(2, "0")}m` : m ? `${m}m ${String(s % 60).padStart(2, "0")}s` : `${s}s`;
  }
  const localTime = (iso) => (iso ? new Date(iso).toLocaleString() : "–");
  function statusHtml(run) {
    let text = `<span class="status-${run.status}">${escapeHtml(run.status)}</span>`;
    if (run.status === "running") {
      text += run.silent
        ? ` <span class="silent" title="no step recorded recently">silent ${duration(run.heartbeat_age_s)}</span>`
        : ` <small class="muted" title="since the newest step">♥ ${duration(run.heartbeat_age_s)} ago</small>`;
    }
    return text;
  }
  function linksHtml(run) {
    const links = [];
    if (run.links.prefect) links.push(`<a href="${escapeHtml(run.links.prefect)}">Prefect</a>`);
    if (run.links.mlflow) links.push(`<a href="${escapeHtml(run.links.mlflow)}">MLflow</a>`);
    return links.join(" · ");
  }

  function layout(title, xTitle, yTitle, extra = {}) {
    return {
      title: { text: title, font: { size: 14 }, x: 0.01, xanchor: "left" },
      margin: { l: 55, r: 15, t: 40, b: 45 },
      xaxis: { title: { text: xTitle } },
      yaxis: { title: { text: yTitle } },
      legend: { orientation: "h", y: -0.25 },
      ...extra,
    };
  }
  const draw = (id, traces, chartLayout) => Plotly.react(id, traces, chartLayout, PLOT_CONFIG);

  // ----- the runs list -----

  function runsPage() {
    const form = document.getElementById("filters");
    const params = new URLSearchParams(location.search);
    const selected = new Set();
    const compareButton = document.getElementById("compare-selected");
    compareButton.addEventListener("click", () => {
      location.href = "/compare?" + [...selected].map((id) => "run=" + encodeURIComponent(id)).join("&");
    });
    form.addEventListener("change", () => {
      const query = new URLSearchParams();
      for (const select of form.querySelectorAll("select")) if (select.value) query.set(select.name, select.value);
      location.search = query.toString();
    });
    function fillSelect(name, values) {
      const select = form.querySelector(`select[name=${name}]`);
      const current = params.get(name) || "";
      const options = ["", ...values];
      if (current && !options.includes(current)) options.push(current);
      select.innerHTML = options.map((v) => `<option value="${escapeHtml(v)}">${v ? escapeHtml(v) : "any"}</option>`).join("");
      select.value = current;
    }
    poll(async () => {
      const query = new URLSearchParams({ limit: String(RUNS_SHOWN) });
      for (const name of ["experiment", "mode", "status"]) if (params.get(name)) query.set(name, params.get(name));
      const data = await api("/api/runs?" + query.toString());
      fillSelect("experiment", data.experiments);
      fillSelect("mode", data.modes);
      fillSelect("status", data.statuses);
      document.getElementById("runs-message").textContent =
        (data.runs.length ? "" : "No runs match. ") + data.warnings.join(" ");
      document.querySelector("#runs tbody").innerHTML = data.runs.map((run) => `
        <tr data-run-id="${escapeHtml(run.id)}">
          <td><input type="checkbox" value="${escapeHtml(run.id)}" ${selected.has(run.id) ? "checked" : ""}></td>
          <td><a href="/runs/${encodeURIComponent(run.id)}">${escapeHtml(run.id)}</a></td>
          <td>${escapeHtml(run.experiment)}</td><td>${escapeHtml(run.mode)}</td><td>${statusHtml(run)}</td>
          <td class="num policy-version">${run.policy_version ?? "–"}</td><td class="num">${num(run.reward_mean)}</td>
          <td class="num" title="${escapeHtml(run.latest_eval ? run.latest_eval.name : "")}">${num(run.latest_eval && run.latest_eval.value)}</td>
          <td class="num">${num(run.ess)}</td><td class="num">${run.lag_max ?? "–"}</td>
          <td class="num">${num(run.tokens_per_s.actor, 0)} · ${num(run.tokens_per_s.trainer, 0)}</td>
          <td>${localTime(run.started_at)}</td><td class="num">${duration(run.wall_s)}</td><td>${linksHtml(run)}</td>
        </tr>`).join("");
      for (const box of document.querySelectorAll("#runs tbody input[type=checkbox]")) {
        box.addEventListener("change", () => {
          if (box.checked) selected.add(box.value); else selected.delete(box.value);
          compareButton.disabled = selected.size < 2;
        });
      }
    });
  }

  // ----- one run, live -----

  function runPage(runId) {
    const base = "/api/runs/" + encodeURIComponent(runId);
    poll(async () => {
      const [run, steps, live, histogram, heatmap] = await Promise.all([
        api(base), api(base + "/steps"), api(base + "/live"), api(base + "/lag-histogram"),
        api(base + "/lag-by-position"),
      ]);
      document.getElementById("run-mode").textContent = run.mode;
      document.getElementById("run-status").innerHTML = statusHtml(run);
      document.getElementById("policy-version").textContent = live.policy_version ?? "–";
      document.getElementById("wall-time").textContent = duration(live.wall_s);
      document.getElementById("run-links").innerHTML = linksHtml(run);
      document.getElementById("run-warnings").textContent = [...run.warnings, ...live.warnings, ...heatmap.warnings].join(" ");
      drawStages(live.stages);
      drawRunCharts(steps, live, histogram, heatmap);
      drawPrediction(live.prediction);
      drawPhase(live.phase, steps);
      return run.status === "running";  // a finished run is drawn once
    });
  }

  function drawStages(stages) {
    const stage = (id, figure, idle, idleName = "idle") => {
      const box = document.getElementById(id);
      box.querySelector(".figure").textContent = figure;
      box.querySelector(".idle").textContent = idleName + " " + (idle === null || idle === undefined ? "–" : Math.round(100 * idle) + " %");
    };
    // units from the metric registry (the API names each box's metrics and their units)
    stage("stage-actor", num(stages.actor.tokens_per_s, 0) + " " + stages.actor.units.tokens_per_s, stages.actor.idle_fraction);
    stage("stage-preprocessor", num(stages.preprocessor.samples_per_s, 1) + " samples/s", stages.preprocessor.held_fraction, "held for the trainer");
    stage("stage-trainer", num(stages.trainer.tokens_per_s, 0) + " " + stages.trainer.units.tokens_per_s, stages.trainer.idle_fraction);
    document.querySelector("#queue-rollouts span").textContent = stages.rollout_queue ?? "–";
    document.querySelector("#queue-batches span").textContent = stages.batches_ahead ?? "–";
  }

  // What a running run does now (the launcher's phase: the starting evaluation, the stages starting...);
  // before its first step it is all there is to show, so it stands out then.
  function drawPhase(phase, steps) {
    const box = document.getElementById("run-phase");
    if (!phase) { box.hidden = true; return; }
    box.hidden = false;
    const before = !steps.version || steps.version.length === 0;
    box.classList.toggle("before-first-step", before);
    box.textContent = (before ? "Before the first step: " : "Now: ") + `${phase.text} (for ${duration(phase.for_s)})`;
  }

  // A planned run's prediction beside what it measured (plan_prediction.json); absent otherwise.
  const PREDICTION_DIGITS = { lag_max: 0 };
  function drawPrediction(prediction) {
    const section = document.getElementById("prediction");
    if (!prediction) { section.hidden = true; return; }
    section.hidden = false;
    const about = document.getElementById("prediction-about");
    if (prediction.error) {
      about.textContent = "Not compared: " + prediction.error;
      document.querySelector("#prediction-table tbody").innerHTML = "";
      return;
    }
    about.textContent = `simulated in ${prediction.mode ?? "–"} mode with profile ${prediction.profile ?? "–"} and lengths ${prediction.lengths ?? "–"}; difference: predicted − measured`;
    document.querySelector("#prediction-table tbody").innerHTML = prediction.rows.map((row) => {
      const digits = PREDICTION_DIGITS[row.figure] ?? 2;
      const sign = row.difference > 0 ? "+" : "";
      const relative = row.relative === null ? "" : ` (${row.relative > 0 ? "+" : ""}${Math.round(100 * row.relative)} %)`;
      return `<tr data-figure="${escapeHtml(row.figure)}"><td>${escapeHtml(row.label)}</td><td class="num">${num(row.predicted, digits)}</td>`
        + `<td class="num">${num(row.measured, digits)}</td><td class="num">${sign}${num(row.difference, digits)}${relative}</td></tr>`;
    }).join("");
  }

  // The raw train reward (faint) and its trailing mean (the series the time to target is read from).
  const trailingName = (steps) => `trailing mean (${steps.reward_window} steps)`;

  function drawRunCharts(steps, live, histogram, heatmap) {
    const reward = (x) => [
      { x, y: steps.reward_mean, name: "train reward", mode: "lines+markers", opacity: 0.45, line: { color: PALETTE[0], width: 1 }, marker: { size: 4 } },
      { x, y: steps.reward_trailing_mean, name: trailingName(steps), mode: "lines", line: { color: PALETTE[0], width: 2.5 } },
    ];
    // Each evaluation sits where its policy was trained (the step that produced its version).
    const evals = (axis) => live.evals.map((series, i) => ({
      x: series[axis], y: series.value, name: series.name, mode: "markers+lines",
      line: { color: PALETTE[(i + 1) % PALETTE.length], dash: "dot" },
    }));
    draw("chart-reward-time", [...reward(steps.wall_s), ...evals("wall_s")], layout("Reward and held-out eval against wall time", "seconds since training started", "success"));
    draw("chart-reward-samples", [...reward(steps.samples_trained), ...evals("samples_trained")], layout("Reward and held-out eval against samples", "samples trained", "success"));
    draw("chart-ess", [{ x: steps.version, y: steps.ess, name: "ESS", mode: "lines+markers", line: { color: PALETTE[2] } }], layout("ESS per step", "policy version", "ESS", ESS_AXIS));
    draw("chart-lag-histogram", [{ x: histogram.lag, y: histogram.count, type: "bar", name: "tokens", marker: { color: PALETTE[0] } }],
      layout(`Token lag, step v${histogram.version ?? "–"}`, "lag (versions behind the trainer)", "tokens", { xaxis: { dtick: 1, title: { text: "lag (versions behind the trainer)" } } }));
    draw("chart-lag-heatmap", [{ type: "heatmap", x: heatmap.versions, y: heatmap.position_start, z: heatmap.mean_lag, colorscale: "Viridis", colorbar: { title: { text: "mean lag" } } }],
      layout("Lag against token position over steps", "policy version (step)", `token position (buckets of ${heatmap.bucket_size})`));
    const pauses = live.pauses;
    draw("chart-pauses", [
      { x: pauses.map((p) => p.wall_s), y: pauses.map((p) => p.broadcast_ms), type: "bar", name: "trainer: broadcast", marker: { color: PALETTE[3] } },
      { x: pauses.map((p) => p.wall_s), y: pauses.map((p) => p.pause_ms), type: "bar", name: "actor: generation paused", marker: { color: PALETTE[4] } },
    ], layout("Weight-update pauses by phase", "seconds since training started", "ms", { barmode: "stack" }));
    const multi = live.multi_version_sequences;
    draw("chart-multi-version", [{ x: multi.map((m) => m.version), y: multi.map((m) => m.sequences), type: "bar", name: "sequences", marker: { color: PALETTE[5] } }],
      layout("Sequences written by two or more policy versions", "policy version (step)", "sequences"));
    const events = [
      ...live.checkpoints.map((c) => ({ version: c.version, text: `checkpoint v${c.version}: ${c.path}` })),
      ...live.restarts.map((r) => ({ version: r.version, text: `restart ${r.restart} at v${r.version} (${duration(r.wall_s)} in)` })),
    ].sort((a, b) => a.version - b.version);
    document.querySelector("#events ul").innerHTML = events.length
      ? events.map((e) => `<li>${escapeHtml(e.text)}</li>`).join("") : "<li class='muted'>none yet</li>";
  }

  // ----- comparisons -----

  function comparePage(runIds) {
    const query = runIds.map((id) => "run=" + encodeURIComponent(id)).join("&");
    poll(async () => {
      const data = await api("/api/compare?" + query);
      document.getElementById("compare-what").innerHTML = (data.parent ? `children of <b>${escapeHtml(data.parent)}</b>: ` : "")
        + data.runs.map((r) => `<a href="/runs/${encodeURIComponent(r.run_id)}">${escapeHtml(r.label)}</a>`).join(", ");
      document.getElementById("compare-warnings").textContent = data.warnings.join(" ");
      const line = (run, i, x, y, extra = {}) => ({
        x, y, name: run.label, mode: "lines", line: { color: PALETTE[i % PALETTE.length], ...extra }, legendgroup: run.label,
      });
      const per = (fn) => data.runs.map((run, i) => fn(run, i)).flat();
      // Per run: the raw train reward (faint) and its trailing mean, whose first crossing of the
      // target line is the run's time to target in the table below.
      const rewards = (r, i, x) => [
        { ...line(r, i, x, r.steps.reward_mean, { width: 1 }), opacity: 0.35, name: `${r.label} train reward`, showlegend: false },
        { ...line(r, i, x, r.steps.reward_trailing_mean, { width: 2.5 }), name: `${r.label} ${trailingName(r.steps)}` },
      ];
      const target = data.table.target === null ? {} : {
        shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: data.table.target, y1: data.table.target, line: { color: "#555", dash: "dot", width: 1 } }],
      };
      draw("chart-reward-time", per((r, i) => rewards(r, i, r.steps.wall_s)), layout("Train reward against wall time (bold: trailing mean, dotted: target)", "seconds since training started", "reward", target));
      draw("chart-reward-samples", per((r, i) => rewards(r, i, r.steps.samples_trained)), layout("Train reward against samples (bold: trailing mean, dotted: target)", "samples trained", "reward", target));
      // one colour per run, one dash per evaluation (in-run pass@1, start and end success)
      const evalNames = [...new Set(data.runs.flatMap((r) => r.evals.map((e) => e.name)))].sort();
      const evalLine = (r, i, e, x) => ({
        ...line(r, i, x, e.value, { dash: EVAL_DASHES[evalNames.indexOf(e.name) % EVAL_DASHES.length] }),
        mode: "lines+markers", name: `${r.label} ${e.name}`,
      });
      draw("chart-eval-time", per((r, i) => r.evals.map((e) => evalLine(r, i, e, e.wall_s))), layout("Held-out eval against wall time", "seconds since training started", "success"));
      draw("chart-eval-samples", per((r, i) => r.evals.map((e) => evalLine(r, i, e, e.samples_trained))), layout("Held-out eval against samples", "samples trained", "success"));
      draw("chart-ess", per((r, i) => line(r, i, r.steps.version, r.steps.ess)), layout("ESS by step", "policy version", "ESS", ESS_AXIS));
      draw("chart-lag", per((r, i) => [line(r, i, r.steps.version, r.steps.lag_mean), { ...line(r, i, r.steps.version, r.steps.lag_max, { dash: "dash" }), name: r.label + " max", showlegend: false }]), layout("Lag by step (mean solid, max dashed)", "policy version", "lag"));
      drawCompareTable(data.table);
      return data.runs.some((r) => r.status === "running");
    });
  }

  function drawCompareTable(table) {
    document.getElementById("target").textContent = table.target === null
      ? "No target: no run has a step yet."
      : `Target: trailing mean (${table.window} steps) of the train reward ≥ ${num(table.target)}; ${table.meaning}.`;
    const baselines = table.baselines;
    document.querySelector("#compare-table thead").innerHTML = "<tr><th>run</th><th>mode</th><th>time to target</th><th>samples to target</th>"
      + baselines.map((b) => `<th title="${escapeHtml(b)}'s time to target ÷ this run's (above 1: this run got there sooner)">× faster than ${escapeHtml(b)}</th>`).join("")
      + "<th>mean ESS</th><th>mean lag</th><th>max lag</th><th>steps</th></tr>";
    document.querySelector("#compare-table tbody").innerHTML = table.rows.map((row) => `<tr>
      <td>${escapeHtml(row.label)}</td><td>${escapeHtml(row.mode)}</td><td class="num">${row.time_to_target_s === null ? "not reached" : duration(row.time_to_target_s)}</td>
      <td class="num">${row.samples_to_target ?? "–"}</td>
      ${baselines.map((b) => `<td class="num">${row.times_faster_than[b] === null ? "–" : num(row.times_faster_than[b], 2) + "×"}</td>`).join("")}
      <td class="num">${num(row.ess_mean)}</td><td class="num">${num(row.lag_mean, 2)}</td><td class="num">${row.lag_max ?? "–"}</td><td class="num">${row.steps}</td>
    </tr>`).join("");
  }

  // ----- plans (the simulator's predictions, saved under the platform home) -----

  // One colour per mode, the same in every plan.
  const MODE_COLOURS = { pipeline: PALETTE[0], conventional: PALETTE[1], async: PALETTE[2], colocated: PALETTE[3] };
  const modeColour = (mode, i) => MODE_COLOURS[mode] || PALETTE[(i + 4) % PALETTE.length];
  const planUrl = (name) => "/plan?name=" + encodeURIComponent(name);
  const breakable = (text) => escapeHtml(text).replace(/,/g, ",<wbr>");  // a long cluster wraps at its commas

  function planPage(selected) {
    const form = document.getElementById("plan-form");
    const submit = document.getElementById("plan-submit");
    const status = document.getElementById("plan-status");
    const error = document.getElementById("plan-error");
    let current = selected;

    async function showList() {
      const data = await api("/api/plans");
      document.getElementById("plans-message").textContent = data.warnings.join(" ");
      document.getElementById("no-plans").hidden = data.plans.length > 0;
      document.querySelector("#plans tbody").innerHTML = data.plans.map((plan) => `
        <tr data-plan-name="${escapeHtml(plan.name)}"${plan.name === current ? ' class="selected"' : ""}>
          <td>${localTime(plan.created)}</td><td><a href="${planUrl(plan.name)}">${escapeHtml(plan.name)}</a></td>
          <td>${escapeHtml(plan.profile ?? "–")}</td><td>${breakable(plan.cluster ?? "–")}</td>
          <td>${plan.swept ? breakable(plan.sweep || plan.swept) : escapeHtml(plan.modes.join(", "))}</td>
          <td class="num">${plan.swept ? escapeHtml(`${plan.swept}=${plan.recommended}`) : "–"}</td>
        </tr>`).join("");
      return data;
    }

    async function load() {
      try {
        const list = await showList();
        if (!current && list.plans.length) current = list.plans[0].name;
        if (current) drawPlan(current, await api("/api/plans/" + encodeURIComponent(current)));
        banner(null);
      } catch (failure) {
        banner(failure.message);
      }
    }

    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const prompt = document.getElementById("plan-prompt-tokens");
      const body = {
        profile: form.elements.profile.value,
        cluster: form.elements.cluster.value,
        lengths: form.elements.lengths.value,
        sweep: form.elements.sweep.value,
        modes: [...form.querySelectorAll("input[name=modes]:checked")].map((box) => box.value),
        settings: form.elements.settings.value,
        prompt_tokens: Number.isFinite(prompt.valueAsNumber) ? prompt.valueAsNumber : prompt.value,
      };
      error.hidden = true;
      error.textContent = "";
      submit.disabled = true;
      status.textContent = "simulating…";
      try {
        const made = await post("/api/plan", body);
        current = made.name;
        history.replaceState(null, "", planUrl(made.name));
        await showList();
        drawPlan(made.name, made.plan);
        status.textContent = "saved as " + made.name;
      } catch (failure) {
        status.textContent = "";
        error.textContent = failure.message;
        error.hidden = false;
      } finally {
        submit.disabled = false;
      }
    });
    load();
  }

  function askedText(plan) {
    const asked = plan.asked;
    return [
      `profile ${asked.profile}`, asked.cluster ? `cluster ${asked.cluster}` : "no cluster (the configuration's actors)",
      `lengths ${asked.lengths}`, `prompt tokens ${asked.prompt_tokens}`, `modes ${asked.modes.join(", ")}`,
      asked.sweep ? `sweep ${asked.sweep}` : null, `seed ${asked.seed}`,
      plan.created ? `created ${String(plan.created).replace(/^(\d{4})(\d\d)(\d\d)-(\d\d)(\d\d)(\d\d)$/, "$1-$2-$3 $4:$5:$6")} UTC` : null,
    ].filter(Boolean).join(" · ");
  }

  const PLAN_COLUMNS = [
    ["samples/s", (r) => num(r.samples_per_s, 2)],
    ["samples/s after the first step", (r) => num(r.steady_samples_per_s, 2)],
    ["actor idle", (r) => num(r.actor_idle, 2)],
    ["trainer idle", (r) => num(r.trainer_idle, 2)],
    ["lag mean", (r) => num(r.lag_mean, 2)],
    ["lag max", (r) => r.lag_max ?? "–"],
    ["seconds", (r) => num(r.seconds, 1)],
  ];

  function drawPlan(name, plan) {
    document.getElementById("plan-view").hidden = false;
    document.getElementById("plan-name").textContent = name;
    document.getElementById("plan-asked").textContent = askedText(plan);
    for (const row of document.querySelectorAll("#plans tbody tr")) row.classList.toggle("selected", row.dataset.planName === name);
    const sweep = Array.isArray(plan.points);
    document.getElementById("plan-sweep-view").hidden = !sweep;
    document.getElementById("plan-plain-view").hidden = sweep;
    const head = (first) => "<tr>" + [...first, ...PLAN_COLUMNS.map(([title]) => title)].map((t) => `<th>${escapeHtml(t)}</th>`).join("") + "</tr>";
    const cells = (run) => PLAN_COLUMNS.map(([, cell]) => `<td class="num">${cell(run)}</td>`).join("");
    if (!sweep) {
      const modes = Object.keys(plan.runs);
      document.querySelector("#plan-runs thead").innerHTML = head(["mode"]);
      document.querySelector("#plan-runs tbody").innerHTML = modes.map((mode) =>
        `<tr data-mode="${escapeHtml(mode)}"><td>${escapeHtml(mode)}</td>${cells(plan.runs[mode])}</tr>`).join("");
      const ratios = Object.entries(plan.speedups || {});
      document.getElementById("plan-speedups").textContent = ratios.length
        ? "Speed-up: " + ratios.map(([other, ratio]) => `${modes[0]} gives ${num(ratio, 2)}× the samples/s of ${other}`).join("; ") + "."
        : "";
      return;
    }
    const modes = plan.asked.modes.filter((mode) => plan.points.length && mode in plan.points[0].runs);
    const x = plan.points.map((point) => point.value);
    const best = plan.points.find((point) => point.value === plan.recommended);
    document.getElementById("plan-recommended").textContent = `${plan.swept}=${plan.recommended}`;
    document.getElementById("plan-first-mode").textContent = modes[0] ?? "–";
    document.getElementById("plan-reason").textContent = plan.reason;
    const marked = {
      shapes: [{ type: "line", x0: plan.recommended, x1: plan.recommended, yref: "paper", y0: 0, y1: 1, line: { color: "#555", dash: "dot", width: 1 } }],
    };
    const speed = modes.map((mode, i) => ({
      x, y: plan.points.map((point) => point.runs[mode].samples_per_s), name: mode, mode: "lines+markers", line: { color: modeColour(mode, i), width: 2.5 },
    }));
    if (best && modes.length) {
      speed.push({
        x: [plan.recommended], y: [best.runs[modes[0]].samples_per_s], name: `recommended: ${plan.swept}=${plan.recommended}`,
        mode: "markers", marker: { symbol: "star", size: 16, color: "#1d232a" },
      });
    }
    draw("chart-plan-speed", speed, layout(`Predicted samples/s against ${plan.swept} (dotted: recommended)`, plan.swept, "samples/s", marked));
    const idle = modes.flatMap((mode, i) => [
      { x, y: plan.points.map((point) => point.runs[mode].actor_idle), name: `${mode} actor idle`, mode: "lines+markers", line: { color: modeColour(mode, i) } },
      { x, y: plan.points.map((point) => point.runs[mode].trainer_idle), name: `${mode} trainer idle`, mode: "lines+markers", line: { color: modeColour(mode, i), dash: "dash" } },
    ]);
    draw("chart-plan-idle", idle, layout(`Idle shares against ${plan.swept} (actors solid, trainer dashed)`, plan.swept, "share of the time idle",
      { ...marked, yaxis: { range: [0, 1.05], title: { text: "share of the time idle" } } }));
    document.querySelector("#plan-points thead").innerHTML = head([plan.swept, "cluster", "mode"]);
    document.querySelector("#plan-points tbody").innerHTML = plan.points.flatMap((point) => modes.map((mode) => `
      <tr data-value="${point.value}" data-mode="${escapeHtml(mode)}"${point.value === plan.recommended ? ' class="recommended"' : ""}>
        <td class="num">${point.value}</td><td>${escapeHtml(point.cluster ?? "–")}</td><td>${escapeHtml(mode)}</td>${cells(point.runs[mode])}
      </tr>`)).join("");
  }

  return { runsPage, runPage, comparePage, planPage };
})();
