"""The report: its data (reportlib), charts (reportcharts), sections (a data function and a Jinja2 template each, in
workflow/report/templates) and the notebook's rendering (render). It reads amprepro.analysis and amprepro.verify;
nothing below it imports it."""
