// Live pages (every page with hx-ext="ws"): how their socket comes back after the
// server was away, and what the page says meanwhile in the top bar's #live.
(function () {
  "use strict";
  // Soon after the server returns: 250 ms doubling to at most 1.5 s between tries,
  // half of it jittered so many pages do not knock at the same instant.
  var MAX_DELAY = 1500;
  htmx.config.wsReconnectDelay = function (retryCount) {
    var delay = Math.min(250 * Math.pow(2, retryCount), MAX_DELAY);
    return delay / 2 + (Math.random() * delay) / 2;
  };
  // Closes the extension retries by itself (abnormal, server error, restart, overload);
  // 1001 is a server going away on purpose (a restart): it is retried here.
  var RETRIED = [1006, 1011, 1012, 1013];

  function show(text, state) {
    var badge = document.getElementById("live");
    if (!badge) return;
    badge.hidden = false;
    badge.textContent = text;
    badge.className = "live " + state;
  }

  document.addEventListener("htmx:wsConnecting", function () {
    var badge = document.getElementById("live");
    if (badge && badge.hidden) show("connecting…", "connecting");
  });
  document.addEventListener("htmx:wsOpen", function () {
    show("live", "on");
  });
  document.addEventListener("htmx:wsClose", function (event) {
    var code = event.detail.event.code;
    if (RETRIED.indexOf(code) >= 0) {
      show("offline — reconnecting", "off");
    } else if (code === 1001) {
      show("offline — reconnecting", "off");
      var socket = event.detail.socketWrapper;
      setTimeout(function () { socket.reconnect(); }, htmx.config.wsReconnectDelay(0));
    } else {
      // Closed by the server for a reason the page is told (#live-notice): no retry.
      show("not live", "stopped");
    }
  });
})();
