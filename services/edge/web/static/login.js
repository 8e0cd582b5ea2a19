// The sign-in page: a plain form (the token never passes through a script). This only shows
// the "not accepted" line after a refused attempt (the edge redirects to /console?denied=1).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  if (new URLSearchParams(location.search).has("denied")) {
    document.getElementById("denied").hidden = false;
  }
});
