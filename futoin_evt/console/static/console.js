// futoin-evt console: a page's table refreshes itself, a live tail follows its stream.
"use strict";

// <main data-refresh="N">: fetch the page again every N seconds and swap its content,
// unless the user is typing in one of its fields. A refusal (a right revoked, the stream
// dropped) takes the content's place, and the page stops refreshing.
function refresh(main) {
  const seconds = Number(main.dataset.refresh);
  const timer = setInterval(async () => {
    if (document.hidden || main.contains(document.activeElement) && document.activeElement.tagName === "INPUT") {
      return;
    }
    const reply = await fetch(location.href, { credentials: "same-origin" });
    const refused = reply.status >= 400 && reply.status < 500;
    if (!(reply.ok || refused) || reply.redirected) {
      return;
    }
    const page = new DOMParser().parseFromString(await reply.text(), "text/html");
    const fresh = page.getElementById("main");
    if (fresh) {
      main.replaceChildren(...fresh.childNodes);
      if (refused) {
        clearInterval(timer);
      }
    }
  }, seconds * 1000);
}

// <table id="tail" data-source="URL" data-rows="N">: one row per notification, newest on
// top, at most N rows. Text only (textContent): nothing the events hold becomes markup.
function follow(table) {
  const body = table.tBodies[0];
  const keep = Number(table.dataset.rows);
  const state = document.getElementById("tail-state");
  const source = new EventSource(table.dataset.source);
  source.onopen = () => {
    table.dataset.state = "live";
    state.textContent = "following";
  };
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {  // refused: it does not try again
      table.dataset.state = "ended";
      state.textContent = "ended";
      return;
    }
    table.dataset.state = "reconnecting";
    state.textContent = "reconnecting…";
  };
  // The server ends the tail (a right it needed was revoked): say why, and stay closed.
  source.addEventListener("ended", (event) => {
    source.close();
    table.dataset.state = "ended";
    state.textContent = "ended";
    const alert = document.createElement("p");
    alert.className = "error";
    alert.setAttribute("role", "alert");
    alert.textContent = String(JSON.parse(event.data));
    table.before(alert);
  });
  source.onmessage = (event) => {
    for (const item of JSON.parse(event.data)) {
      const row = body.insertRow(0);
      row.className = "new";
      const shown = item.message.body !== undefined && item.message.properties === undefined
        ? item.message.body : (item.message.properties || item.message);
      for (const value of [item.id ?? "", item.type, item.ts, JSON.stringify(shown)]) {
        row.insertCell().textContent = String(value);
      }
      row.cells[0].className = "num";
      row.cells[2].className = "ts";
    }
    while (body.rows.length > keep) {
      body.deleteRow(-1);
    }
  };
}

document.addEventListener("DOMContentLoaded", () => {
  const main = document.getElementById("main");
  if (main && main.dataset.refresh) {
    refresh(main);
  }
  const tail = document.getElementById("tail");
  if (tail) {
    follow(tail);
  }
});

// <circle class="dot" data-label="..."> in a chart: its value shows by the pointer (text
// only). Listened to on the document: a refreshed page's charts need nothing more.
document.addEventListener("DOMContentLoaded", () => {
  const tip = document.createElement("div");
  tip.id = "tip";
  tip.className = "tip";
  tip.hidden = true;
  document.body.append(tip);
  document.addEventListener("mouseover", (event) => {
    const dot = event.target instanceof Element ? event.target.closest("circle.dot") : null;
    if (!dot) {
      return;
    }
    const box = dot.getBoundingClientRect();
    tip.textContent = dot.dataset.label;
    tip.style.left = `${box.left + window.scrollX + 10}px`;
    tip.style.top = `${box.top + window.scrollY - 30}px`;
    tip.hidden = false;
  });
  document.addEventListener("mouseout", (event) => {
    if (event.target instanceof Element && event.target.closest("circle.dot")) {
      tip.hidden = true;
    }
  });
});
