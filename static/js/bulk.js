// The run list's bulk selection: ticks survive the live updates that redraw rows or
// the whole table (a redrawn row comes back unticked otherwise).
(function () {
  "use strict";
  var ticked = new Set();
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (box.name !== "run" || box.getAttribute("form") !== "bulk") return;
    if (box.checked) ticked.add(box.value); else ticked.delete(box.value);
  });
  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll('input[name="run"][form="bulk"]').forEach(function (box) {
      box.checked = ticked.has(box.value);
    });
  });
  document.addEventListener("htmx:oobAfterSwap", function () {
    document.querySelectorAll('input[name="run"][form="bulk"]').forEach(function (box) {
      box.checked = ticked.has(box.value);
    });
  });
})();

// "All matching" takes the filters the list shows now: after filtering in place the
// address holds them (hx-push-url), the form's own hidden fields those it loaded with.
document.addEventListener("submit", function (event) {
  var form = event.target;
  if (form.id !== "bulk") return;
  form.querySelectorAll("input[data-filter]").forEach(function (input) { input.remove(); });
  new URLSearchParams(window.location.search).forEach(function (value, name) {
    if (name === "after" || !value) return;
    var input = document.createElement("input");
    input.type = "hidden";
    input.name = name;
    input.value = value;
    input.dataset.filter = "";
    form.appendChild(input);
  });
});
