"""What is read off finished training runs: the HTML report page (``page``), the curves
(``plot``, ``drmas-bench plot``) and the regression bands (``regress``, ``drmas-bench regress``)."""
