/* tracestory interactive timeline: one canvas 2D, no library, no network.
 *
 * Reads the JSON block #ts-timeline-data written by tracestory.render.timeline_page (times in
 * microseconds from the trace start; each lane's starts delta-coded) and draws one row per
 * lane. Wheel zooms around the pointer, drag pans, hover (or click to pin) reads a span out.
 * Decimation: at the current zoom, spans narrower than one pixel column of a lane are merged
 * into one 1-px bar coloured by the longest of them; the corner says how many were merged.
 * A click on a finding link zooms to the window and highlights the spans the model computed
 * for it (nothing is recomputed here). window.tracestoryTimeline is the page's test handle.
 */
(function () {
  "use strict";
  // The script sits before the report's body: start once the whole page is parsed.
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();

  function init() {
    var root = document.getElementById("ts-timeline");
    var dataEl = document.getElementById("ts-timeline-data");
    if (!root || !dataEl) return;
    var D = JSON.parse(dataEl.textContent);
    var canvas = root.querySelector("canvas");
    var ctx = canvas.getContext("2d");
    var readout = root.querySelector(".ts-readout");
    var LANE_H = 18, GUTTER = 200, AXIS_H = 22, BOTTOM = 4;
    var PHASE = ["#b7c6de", "#d6dfee"], IDLE = "#e9a3a3";

    // ---- spans: decode the delta-coded starts, per lane a running maximum of the ends
    var n = D.spans.d.length;
    var S = new Float64Array(n), E = new Float64Array(n), ME = new Float64Array(n);
    var NM = Int32Array.from(D.spans.n), CT = Int32Array.from(D.spans.c);
    D.lanes.forEach(function (lane) {
      var acc = 0, mx = -Infinity;
      for (var i = lane.off; i < lane.off + lane.n; i++) {
        acc += D.spans.s[i];
        S[i] = acc;
        E[i] = acc + D.spans.d[i];
        mx = Math.max(mx, E[i]);
        ME[i] = mx;
      }
    });
    var density = D.density ? D.density.lanes : null;

    var full0 = 0, full1 = Math.max(D.end, 1e-3);
    var v0 = full0, v1 = full1;
    var hl = null, hlLanes = null, hlWin = [], pinned = null, dpr = 1, cssW = 800;
    var stats = { drawn: 0, merged: 0, draws: 0, lastDrawMs: 0 };
    var api = { ready: false, firstDrawMs: null, stats: stats };

    function fmt(us) {
      var a = Math.abs(us);
      if (a === 0) return "0";
    if (a < 1) return (us * 1000).toPrecision(3) + " ns";
      if (a < 1000) return us.toPrecision(4) + " us";
      if (a < 1e6) return (us / 1000).toPrecision(4) + " ms";
      return (us / 1e6).toPrecision(4) + " s";
    }

    function colour(c, i) {
      if (c === -1) return PHASE[i & 1];
      if (c === -2) return IDLE;
      return D.colors[c] || "#999";
    }

    // first span of lane l whose end is past t (ends' running maximum is sorted)
    function first(lane, t) {
      var lo = lane.off, hi = lane.off + lane.n;
      while (lo < hi) {
        var mid = (lo + hi) >> 1;
        if (ME[mid] <= t) lo = mid + 1; else hi = mid;
      }
      return lo;
    }

    function plotW() { return Math.max(cssW - GUTTER - 8, 10); }

    function resize() {
      dpr = window.devicePixelRatio || 1;
      cssW = Math.max(root.clientWidth, 300);
      var h = AXIS_H + D.lanes.length * LANE_H + BOTTOM;
      canvas.width = Math.round(cssW * dpr);
      canvas.height = Math.round(h * dpr);
      canvas.style.width = cssW + "px";
      canvas.style.height = h + "px";
    }

    function niceStep(span, px) {
      var raw = span / Math.max(px / 110, 1), p = Math.pow(10, Math.floor(Math.log10(raw)));
      var m = raw / p;
      return p * (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10);
    }

    function drawLane(l, k, onlyHl) {
      var lane = D.lanes[l], y = AXIS_H + l * LANE_H + 2, h = LANE_H - 4;
      var end = lane.off + lane.n, col = -1, colCount = 0, colCat = 0, colLong = -1, colIdx = 0;
      function flush() {
        if (col < 0) return;
        if (onlyHl) { ctx.fillStyle = "#8b0000"; ctx.fillRect(GUTTER + col, y - 2, 2, h + 4); }
        else { ctx.fillStyle = colour(colCat, colIdx); ctx.fillRect(GUTTER + col, y, 1, h); }
        stats.merged += colCount - 1;
        col = -1;
      }
      for (var i = first(lane, v0); i < end && S[i] < v1; i++) {
        if (onlyHl && !hl[NM[i]]) continue;
        var x0 = (S[i] - v0) * k, x1 = (E[i] - v0) * k;
        if (x1 < 0) continue;
        if (x1 - x0 >= 1) {
          flush();
          var a = Math.max(x0, 0), b = Math.min(x1, plotW());
          ctx.fillStyle = colour(CT[i], i - lane.off);
          ctx.fillRect(GUTTER + a, y, b - a, h);
          if (onlyHl) { ctx.strokeStyle = "#8b0000"; ctx.lineWidth = 2; ctx.strokeRect(GUTTER + a, y - 1, b - a, h + 2); }
          stats.drawn++;
          if (b - a > 50 && !onlyHl && CT[i] !== -2) {
            ctx.fillStyle = "#111";
            var label = D.names[NM[i]], room = Math.floor((b - a - 6) / 6.2);
            ctx.fillText(label.length > room ? label.slice(0, Math.max(room - 1, 1)) + "…" : label, GUTTER + a + 3, y + h - 4);
          }
        } else {
          var px = Math.floor(Math.max(x0, 0));
          if (px !== col) { flush(); col = px; colCount = 0; colLong = -1; }
          colCount++;
          if (E[i] - S[i] > colLong) { colLong = E[i] - S[i]; colCat = CT[i]; colIdx = i - lane.off; }
          stats.drawn++;
        }
      }
      flush();
    }

    function draw() {
      var t = performance.now();
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      var H = AXIS_H + D.lanes.length * LANE_H + BOTTOM, W = plotW(), k = W / (v1 - v0);
      ctx.clearRect(0, 0, cssW, H);
      ctx.fillStyle = "#fff";
      ctx.fillRect(0, 0, cssW, H);
      ctx.font = "11px system-ui, sans-serif";
      stats.drawn = 0; stats.merged = 0;
      // lanes: banding, labels, full-view shading of dropped spans
      for (var l = 0; l < D.lanes.length; l++) {
        var y = AXIS_H + l * LANE_H;
        ctx.fillStyle = l & 1 ? "#f6f8fb" : "#fff";
        ctx.fillRect(0, y, cssW, LANE_H);
        ctx.fillStyle = "#223";
        var lab = D.lanes[l].label;
        ctx.fillText(lab.length > 32 ? lab.slice(0, 31) + "…" : lab, 4, y + LANE_H - 5);
        if (density && density[l]) {
          var row = density[l], bins = row.length, bw = (full1 - full0) / bins;
          var b0 = Math.max(Math.floor((v0 - full0) / bw), 0), b1 = Math.min(Math.ceil((v1 - full0) / bw), bins);
          for (var b = b0; b < b1; b++) {
            var f = row.charCodeAt(b) - 48;
            if (f <= 0) continue;
            var xa = Math.max((full0 + b * bw - v0) * k, 0), xb = Math.min((full0 + (b + 1) * bw - v0) * k, W);
            // opacity grows with the busy share; any busy time at all stays visible
            ctx.fillStyle = "rgba(80,80,80," + (0.3 + 0.6 * f / 9).toFixed(2) + ")";
            ctx.fillRect(GUTTER + xa, y + 2, Math.max(xb - xa, 1), LANE_H - 4);
          }
        }
      }
      ctx.save();
      ctx.beginPath();
      ctx.rect(GUTTER, 0, W, H);
      ctx.clip();
      for (l = 0; l < D.lanes.length; l++) drawLane(l, k, false);
      if (hl) {
        ctx.fillStyle = "rgba(255,255,255,0.6)";
        ctx.fillRect(GUTTER, AXIS_H, W, D.lanes.length * LANE_H);
        var drawn = stats.drawn, merged = stats.merged;
        for (l = 0; l < D.lanes.length; l++) if (!hlLanes || hlLanes[l]) drawLane(l, k, true);
        stats.drawn = drawn; stats.merged = merged;
      }
      hlWin.forEach(function (w) {
        var xa = (w[0] - v0) * k, xb = (w[1] - v0) * k;
        if (xb < 0 || xa > W) return;
        ctx.fillStyle = "rgba(255,170,0,0.22)";
        ctx.fillRect(GUTTER + xa, AXIS_H, Math.max(xb - xa, 2), D.lanes.length * LANE_H);
        ctx.strokeStyle = "rgba(200,110,0,0.9)";
        ctx.lineWidth = 1;
        ctx.strokeRect(GUTTER + xa, AXIS_H, Math.max(xb - xa, 2), D.lanes.length * LANE_H);
      });
      // axis
      var step = niceStep(v1 - v0, W);
      ctx.fillStyle = "#445";
      ctx.strokeStyle = "#d5dbe5";
      ctx.lineWidth = 1;
      for (var tk = Math.ceil(v0 / step) * step; tk <= v1; tk += step) {
        var x = GUTTER + (tk - v0) * k;
        ctx.beginPath();
        ctx.moveTo(x + 0.5, AXIS_H - 4);
        ctx.lineTo(x + 0.5, H);
        ctx.stroke();
        ctx.fillText(fmt(tk), x + 2, 12);
      }
      ctx.restore();
      ctx.strokeStyle = "#99a";
      ctx.strokeRect(GUTTER + 0.5, AXIS_H + 0.5, W - 1, D.lanes.length * LANE_H - 1);
      // the corner: what decimation did at this zoom
      var note = stats.merged.toLocaleString("en-US") + " spans merged into pixel columns · view " + fmt(v1 - v0);
      root.querySelector(".ts-merged").textContent = note;
      stats.draws++;
      stats.lastDrawMs = performance.now() - t;
      if (api.firstDrawMs === null) { api.firstDrawMs = performance.now(); api.ready = true; }
    }

    var pending = false;
    function redraw() {
      if (pending) return;
      pending = true;
      requestAnimationFrame(function () { pending = false; draw(); });
    }

    function setView(a, b) {
      var span = full1 - full0, minW = 1e-3;
      if (b - a < minW) { var m = (a + b) / 2; a = m - minW / 2; b = m + minW / 2; }
      if (b - a > span * 1.1) { a = full0 - span * 0.05; b = full1 + span * 0.05; }
      if (a < full0 - span * 0.05) { b += full0 - span * 0.05 - a; a = full0 - span * 0.05; }
      if (b > full1 + span * 0.05) { a -= b - full1 - span * 0.05; b = full1 + span * 0.05; }
      v0 = a; v1 = b;
      redraw();
    }

    function spanAt(px, py) {
      var l = Math.floor((py - AXIS_H) / LANE_H);
      if (l < 0 || l >= D.lanes.length || px < GUTTER) return null;
      var lane = D.lanes[l], k = plotW() / (v1 - v0), t = v0 + (px - GUTTER) / k, tol = 2 / k;
      var best = -1, count = 0, end = lane.off + lane.n;
      for (var i = first(lane, t - tol), guard = 0; i < end && S[i] <= t + tol && guard < 20000; i++, guard++) {
        if (E[i] < t - tol) continue;
        count++;
        if (best < 0 || (S[i] <= t && E[i] >= t && !(S[best] <= t && E[best] >= t)) || E[i] - S[i] > E[best] - S[best]) best = i;
      }
      return best < 0 ? { lane: l, count: 0 } : { lane: l, i: best, count: count };
    }

    function describe(hit) {
      if (!hit) return "";
      var lane = D.lanes[hit.lane];
      if (!hit.count) return lane.label + ": nothing here";
      var i = hit.i, c = CT[i];
      var cat = c === -1 ? "step" : c === -2 ? "idle gap" : D.categories[c];
      var s = D.names[NM[i]] + " — " + lane.label + " — start " + fmt(S[i]) + ", duration " + fmt(E[i] - S[i]) + ", " + cat;
      if (hit.count > 1) s = hit.count + " spans within 2 px (zoom in); longest: " + s;
      return s;
    }

    var drag = null;
    canvas.addEventListener("wheel", function (ev) {
      var x = ev.offsetX - GUTTER;
      if (x < 0) return;
      ev.preventDefault();
      var t = v0 + x / plotW() * (v1 - v0), f = Math.exp(ev.deltaY * 0.002);
      setView(t - (t - v0) * f, t + (v1 - t) * f);
    }, { passive: false });
    canvas.addEventListener("mousedown", function (ev) {
      drag = { x: ev.clientX, a: v0, b: v1, moved: false };
    });
    window.addEventListener("mousemove", function (ev) {
      if (drag) {
        var dx = ev.clientX - drag.x;
        if (Math.abs(dx) > 2) drag.moved = true;
        if (drag.moved) { var dt = dx / plotW() * (drag.b - drag.a); setView(drag.a - dt, drag.b - dt); }
        return;
      }
      if (ev.target === canvas && !pinned) readout.textContent = describe(spanAt(ev.offsetX, ev.offsetY)) || "\u00a0";
    });
    window.addEventListener("mouseup", function (ev) {
      if (drag && !drag.moved && ev.target === canvas) {
        var hit = spanAt(ev.offsetX, ev.offsetY);
        pinned = hit && hit.count ? hit : null;
        readout.textContent = pinned ? "pinned: " + describe(hit) : describe(hit) || "\u00a0";
      }
      drag = null;
    });

    function focus(idx) {
      var f = D.findings[idx];
      if (!f || !f.view) return false;
      var a = f.view[0], b = f.view[1], pad = Math.max((b - a) * 0.05, 1);
      hl = null; hlLanes = null;
      if (f.names.length) { hl = new Uint8Array(D.names.length); f.names.forEach(function (j) { hl[j] = 1; }); }
      if (f.lanes) { hlLanes = new Uint8Array(D.lanes.length); f.lanes.forEach(function (j) { hlLanes[j] = 1; }); }
      hlWin = f.windows;
      root.querySelectorAll("[data-finding]").forEach(function (el) {
        el.classList.toggle("ts-active", Number(el.getAttribute("data-finding")) === idx);
      });
      readout.textContent = f.title + " — " + f.why;
      setView(a - pad, b + pad);
      return true;
    }

    function reset() {
      hl = null; hlLanes = null; hlWin = []; pinned = null;
      root.querySelectorAll(".ts-active").forEach(function (el) { el.classList.remove("ts-active"); });
      readout.textContent = "\u00a0";
      setView(full0, full1);
    }

    // every finding heading of the report gets a link to its spans
    var heads = document.querySelectorAll("main h4");
    D.findings.forEach(function (f, idx) {
      if (!f.view) return;
      for (var h = 0; h < heads.length; h++) {
        var text = heads[h].textContent;
        if (text.slice(text.length - f.title.length) === f.title && !heads[h].querySelector(".ts-go")) {
          var a = document.createElement("a");
          a.href = "#ts-timeline";
          a.className = "ts-go";
          a.setAttribute("data-finding", String(idx));
          a.textContent = "show on timeline";
          heads[h].appendChild(document.createTextNode(" "));
          heads[h].appendChild(a);
          break;
        }
      }
    });
    document.querySelectorAll("[data-finding]").forEach(function (el) {
      el.addEventListener("click", function (ev) {
        ev.preventDefault();
        focus(Number(el.getAttribute("data-finding")));
        root.scrollIntoView({ block: "start" });
      });
    });
    root.querySelector(".ts-reset").addEventListener("click", reset);
    window.addEventListener("resize", function () { resize(); redraw(); });

    api.view = function () { return [v0, v1]; };
    api.setView = setView;
    api.focus = focus;
    api.reset = reset;
    api.gutter = GUTTER;
    api.laneHeight = LANE_H;
    api.axisHeight = AXIS_H;
    window.tracestoryTimeline = api;
    resize();
    draw();
  }
})();
