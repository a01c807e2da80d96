"""One module per page, each registered with `dash.register_page`."""
