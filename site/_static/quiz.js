/* The course book's quizzes: jupyterquiz renders a question from JSON; this file shows one drawn
 * variant at a time, reads an answer with a unit the way gpumem.course.answers does, and adds
 * "New numbers" and "Show answer". gpumem.course.site inlines it (after jupyterquiz's own
 * JavaScript) into a page's first quiz cell: nothing is fetched. */

var GQ_FAMILIES = {
  bytes: {b: 1, byte: 1, bytes: 1, kb: 1e3, mb: 1e6, gb: 1e9, tb: 1e12, kib: 1024, mib: 1048576,
          gib: 1073741824, tib: 1099511627776},
  time: {s: 1, sec: 1, second: 1, seconds: 1, ms: 1e-3, us: 1e-6, "µs": 1e-6, min: 60, minute: 60,
         minutes: 60, h: 3600, hour: 3600, hours: 3600},
  percent: {"%": 1, percent: 1}
};
var GQ_LISTED = {bytes: "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB", time: "s, ms, us, min, h", percent: "%"};
var GQ_NUMBER = /^\s*[~≈]?\s*([+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:e[+-]?\d+)?|[+-]?\.\d+(?:e[+-]?\d+)?)\s*(.*?)\s*$/i;
var GQ_PER = /\s*(?:\/|\bper\b|\beach\b)\s*(?:param(?:eter)?s?|gpus?|ranks?|steps?|layers?|tokens?)?\.?$/i;

function gqFamily(unit) {
  var key = unit.trim().toLowerCase();
  for (var name in GQ_FAMILIES) {
    if (Object.prototype.hasOwnProperty.call(GQ_FAMILIES[name], key)) return [name, GQ_FAMILIES[name][key]];
  }
  return ["count", 1];
}

function gqCountWords(unit) {
  var w = unit.trim().toLowerCase();
  var words = ["", w, w + "s", w.replace(/s$/, ""), w.replace(/es$/, "")];
  if (w === "x" || w === "×" || w === "times") words.push("x", "×", "times");
  return words;
}

/* A number the way the course shows it: 4 significant digits, thousands separated. */
function gqFmt(x) {
  if (x === 0) return "0";
  var digits = (Math.abs(x) >= 1e4 || Number.isInteger(x)) ? 0
    : Math.max(0, 3 - Math.floor(Math.log10(Math.abs(x))));
  return x.toLocaleString("en-US", {minimumFractionDigits: digits, maximumFractionDigits: digits});
}

/* A typed answer in the question's unit: {value, note} or {error} (answers.to_unit's rules). */
function gqRead(text, unit, accepts) {
  text = String(text).slice(0, 200);
  var m = GQ_NUMBER.exec(text);
  if (!m) return {error: "'" + text + "' is not a number; answer with " + accepts};
  var number = parseFloat(m[1].replace(/,/g, ""));
  var written = m[2].replace(GQ_PER, "").trim();
  var want = gqFamily(unit);
  if (want[0] === "count") {
    if (gqCountWords(unit).indexOf(written.toLowerCase()) >= 0) return {value: number, note: ""};
    return {error: "unit '" + written + "' in '" + text + "' does not fit this question; answer with " +
                   accepts + ", no other unit"};
  }
  if (!written) return {value: number, note: ""};
  var got = gqFamily(written);
  if (got[0] !== want[0]) {
    return {error: "unit '" + written + "' in '" + text + "' is not one of " + GQ_LISTED[want[0]] +
                   "; this question wants " + unit};
  }
  var converted = number * got[1] / want[1];
  if (written.toLowerCase() === unit.trim().toLowerCase() || got[1] === want[1]) return {value: converted, note: ""};
  return {value: converted, note: gqFmt(number) + " " + written + " read as " + gqFmt(converted) + " " + unit};
}

function gqEscape(s) {
  var d = document.createElement("div");
  d.textContent = s;
  return d.innerHTML;
}

/* jupyterquiz's numeric box takes digits only; this one takes a unit too and converts it. */
function gqUnits(body, meta) {
  var inp = body.querySelector("input.Input-text");
  if (!inp || meta.unit === undefined) return;
  var label = body.querySelector(".InpLabel");
  if (label) label.textContent = "Your answer (" + meta.accepts + "), then Enter:";
  inp.onkeypress = null;
  inp.onpaste = null;
  inp.setAttribute("aria-label", "answer, " + meta.accepts);
  inp.addEventListener("keydown", function (ev) {
    if (ev.key !== "Enter") return;
    ev.preventDefault();
    var typed = inp.value, fb = document.getElementById("fb" + inp.id.split("-")[0]);
    var read = gqRead(typed, meta.unit, meta.accepts);
    if (read.error) {
      fb.innerHTML = gqEscape(read.error.charAt(0).toUpperCase() + read.error.slice(1) + ".");
      fb.className = "Feedback incorrect";
      fb.style.display = "block";
      return;
    }
    inp.value = String(read.value);
    check_numeric(inp, {keyCode: 13});
    inp.value = typed;
    if (read.note) fb.innerHTML += ' <span class="gq-note">(' + gqEscape(read.note) + ")</span>";
  });
}

/* Render the quiz whose container has id `ident`: one variant per question, from the JSON next to it. */
function gpumemQuiz(ident) {
  var root = document.getElementById(ident);
  var pools = JSON.parse(document.getElementById(ident + "-data").textContent);
  root.querySelectorAll(".gq-question").forEach(function (box) {
    var pool = pools[box.dataset.qid], at = 0;
    var body = document.createElement("div");
    Object.assign(body.dataset, {shufflequestions: "False", shuffleanswers: "False",
                                 preserveresponses: "false", numquestions: "1", maxwidth: "900"});
    var tools = document.createElement("div");
    tools.className = "gq-tools";
    var answer = document.createElement("details");
    answer.className = "gq-answer";
    var again = document.createElement("button");
    again.type = "button";
    again.className = "gq-new";
    again.textContent = "New numbers";
    box.append(body, tools);
    if (pool.length > 1) tools.append(again);
    tools.append(answer);
    function draw() {
      var qa = pool[at], meta = qa.gpumem;
      body.innerHTML = "";
      show_questions([qa], body);
      gqUnits(body, meta);
      answer.open = false;
      answer.innerHTML = "<summary>Show answer</summary><p></p>";
      answer.querySelector("p").textContent = "The answer is " + meta.answer + ". " + meta.explanation;
      box.dataset.variant = String(at);
      if (pool.length > 1) again.title = "draw " + (at + 1) + " of " + pool.length;
    }
    again.addEventListener("click", function () { at = (at + 1) % pool.length; draw(); });
    draw();
  });
}
