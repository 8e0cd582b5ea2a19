// Model output is untrusted. It is rendered as Markdown in two steps, and both must hold:
//  1. marked turns Markdown into HTML, with raw HTML in the text *escaped* — so "<script>" or
//     "<img onerror=…>" written by a model shows as those characters, never as elements;
//  2. DOMPurify sanitises the result with an allow-list (no script, style, img, iframe, form,
//     no event handlers, links only to http(s) and mailto — a "javascript:" link keeps its
//     text and loses its target), and returns a TrustedHTML value: the page's CSP
//     (require-trusted-types-for 'script'; trusted-types dompurify) refuses any other HTML.
// Links open in a new tab without referrer or opener.
"use strict";

window.MeridianMarkdown = (() => {
  const ALLOWED_TAGS = [
    "p", "br", "strong", "em", "del", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "hr",
    "span", "input",
  ];
  const PURIFY = {
    ALLOWED_TAGS,
    ALLOWED_ATTR: ["href", "title", "class", "type", "checked", "disabled", "align"],
    ALLOW_DATA_ATTR: false,
    ALLOWED_URI_REGEXP: /^(?:https?:|mailto:)/i,
    RETURN_TRUSTED_TYPE: true,
  };

  const escapeHtml = (text) =>
    String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  const parser = new window.marked.Marked({
    gfm: true,
    breaks: false,
    renderer: {
      // Raw HTML (block or inline) from the model: shown as text.
      html(token) {
        return escapeHtml(token.text);
      },
    },
  });

  window.DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      if (node.hasAttribute("href")) {
        node.setAttribute("target", "_blank");
        node.setAttribute("rel", "noopener noreferrer nofollow");
      }
    }
    if (node.tagName === "INPUT" && node.getAttribute("type") !== "checkbox") {
      node.remove();
    }
    if (node.hasAttribute && node.hasAttribute("class")) {
      const keep = node.getAttribute("class").split(/\s+/).filter((c) => /^language-[\w-]+$/.test(c));
      if (keep.length) node.setAttribute("class", keep.join(" "));
      else node.removeAttribute("class");
    }
  });

  /** Render ``text`` (Markdown from a model) into ``element``, safely. */
  function render(element, text) {
    const html = parser.parse(String(text), { async: false });
    element.innerHTML = window.DOMPurify.sanitize(html, PURIFY);
  }

  return { render, escapeHtml };
})();
