// deerflow-journal viewer: keeps a running run's timeline up to date by polling for the rows
// after the last one shown. Rows arrive as HTML the server escaped; nothing here evaluates
// stored text.
"use strict";

(function () {
  const timeline = document.getElementById("timeline");
  if (!timeline || timeline.dataset.live !== "1") {
    return;
  }
  const status = document.getElementById("live-status");
  const url = timeline.dataset.liveUrl; // the server encodes the ids in it (urls.url)
  const eventsUrl = timeline.dataset.eventsUrl;
  const interval = Number(timeline.dataset.intervalMs) || 1000;
  let after = Number(timeline.dataset.afterSeq) || 0;

  function taskSection(task) {
    for (const section of timeline.querySelectorAll("section.task")) {
      if (section.dataset.task === task) {
        return section;
      }
    }
    const section = document.createElement("section");
    section.className = "task";
    section.dataset.task = task;
    const title = document.createElement("h3");
    title.textContent = "task " + task;
    section.appendChild(title);
    timeline.appendChild(section);
    return section;
  }

  // The row this one answers was sent before it: give it its "→ #seq" link, as a reload would.
  function linkAnswered(row) {
    if (row.answers === null || row.answers === undefined) {
      return;
    }
    const asked = document.getElementById("e-" + row.answers);
    const summary = asked && asked.querySelector("summary");
    if (!summary) {
      return;
    }
    const href = "#e-" + row.seq;
    for (const link of summary.querySelectorAll("a.answered-by")) {
      if (link.getAttribute("href") === href) {
        return; // sent with the same answer (both rows in one poll)
      }
    }
    const link = document.createElement("a");
    link.className = "answered-by";
    link.setAttribute("href", href);
    link.title = "answered by";
    link.textContent = "→ #" + row.seq;
    const other = summary.querySelector("a.other-run"); // the page puts it last
    summary.insertBefore(document.createTextNode(" "), other);
    summary.insertBefore(link, other);
  }

  function add(row) {
    if (document.getElementById("e-" + row.seq)) {
      return;
    }
    const where = row.task ? taskSection(row.task) : timeline;
    where.insertAdjacentHTML("beforeend", row.html);
    linkAnswered(row);
  }

  // A run longer than the page holds: say where the rest is, as the page itself does.
  function sayCut(finished) {
    status.textContent =
      "the run has more events than this page holds" +
      (finished ? " (it has finished)" : "") + ": ";
    const rest = document.createElement("a");
    rest.className = "rest";
    rest.setAttribute("href", eventsUrl + "?after_seq=" + after);
    rest.textContent = "the rest from the JSON API";
    status.appendChild(rest);
  }

  async function poll() {
    try {
      const response = await fetch(url + "?after_seq=" + after, {
        headers: { Accept: "application/json" },
      });
      if (response.ok) {
        const body = await response.json();
        body.rows.forEach(add);
        after = body.last_seq;
        timeline.dataset.afterSeq = String(after);
        if (body.cut) {
          sayCut(body.finished);
          return;
        }
        if (body.finished) {
          status.textContent = "the run has finished: reload for its summary";
          return;
        }
      } else {
        status.textContent = "live updates paused: the server answered " + response.status;
      }
    } catch (error) {
      status.textContent = "live updates paused: the server cannot be reached";
    }
    window.setTimeout(poll, interval);
  }

  window.setTimeout(poll, interval);
})();
