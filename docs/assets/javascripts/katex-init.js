// Typeset the site's math with the vendored KaTeX: no MathJax, no network.
// Loaded with `defer` after katex.min.js and auto-render.min.js, so the page is parsed and both
// are defined when this runs.
(function () {
  "use strict";

  var options = { throwOnError: false }; // a bad formula shows as .katex-error, which the tests catch

  // pymdownx.arithmatex (generic mode) puts inline math in span.arithmatex as \( ... \) and
  // display math in div.arithmatex as \[ ... \] (or a bare \begin{env} ... \end{env}).
  function renderArithmatex(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      if (el.querySelector(".katex")) return;
      var tex = el.textContent.trim();
      var display = el.tagName !== "SPAN";
      if (tex.startsWith("\\(") && tex.endsWith("\\)")) {
        tex = tex.slice(2, -2);
      } else if (tex.startsWith("\\[") && tex.endsWith("\\]")) {
        tex = tex.slice(2, -2);
        display = true;
      }
      katex.render(tex, el, Object.assign({ displayMode: display }, options));
    });
  }

  // Notebook markdown cells (and LaTeX outputs) keep Jupyter's $ ... $ / $$ ... $$ as text.
  // Only those are scanned for $: elsewhere a dollar sign is just a dollar sign.
  function renderNotebookMath(root) {
    root.querySelectorAll(".jupyter-wrapper .jp-RenderedMarkdown, .jupyter-wrapper .jp-RenderedLatex")
      .forEach(function (el) {
        renderMathInElement(el, Object.assign({
          delimiters: [
            { left: "$$", right: "$$", display: true },
            { left: "\\[", right: "\\]", display: true },
            { left: "\\begin{equation}", right: "\\end{equation}", display: true },
            { left: "\\begin{align}", right: "\\end{align}", display: true },
            { left: "$", right: "$", display: false },
            { left: "\\(", right: "\\)", display: false },
          ],
        }, options));
      });
  }

  renderArithmatex(document);
  renderNotebookMath(document);
})();
