// A graph loads Plotly (4.8 MB) when it is first drawn: after its page's callback answers,
// which on a fleet-sized first paint is the last second before anything shows. It starts with
// the page instead, while the first read runs; the graph then finds window.Plotly there.
(function () {
  const config = JSON.parse(document.getElementById("_dash-config").textContent);
  if (!config.serve_locally || window.Plotly) {
    return;  // from a CDN, or already on the page: the graph's own way
  }
  const script = document.createElement("script");
  script.src = config.requests_pathname_prefix + "_dash-component-suites/plotly/package_data/plotly.min.js";
  script.async = true;
  document.head.appendChild(script);
})();
