// Shared page behaviour: pickers marked data-autosubmit submit their form on change.
document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
  select.addEventListener("change", function () { if (select.value) select.form.submit(); });
});
