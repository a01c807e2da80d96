// Links inside data tables are markdown, rendered as plain <a> elements that would
// reload the whole app. Like dcc.Link, turn a plain click on one that stays in the
// app into a change of the app's URL: Dash Pages then swaps the page in place.
document.addEventListener("click", (event) => {
  if (event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) {
    return;  // a new tab or window, as the user asked
  }
  const link = event.target.closest(".dash-table-container a[href]");
  if (!link || (link.target && link.target !== "_self") || link.origin !== window.location.origin) {
    return;
  }
  event.preventDefault();
  // "app-url" is the app's dcc.Location (see app.py).
  window.dash_clientside.set_props("app-url", {pathname: link.pathname, search: link.search});
  window.scrollTo(0, 0);
});
