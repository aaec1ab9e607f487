// ESLint for the attention page's modules (browser) and their unit tests (Node): `make test` runs it.
import js from "@eslint/js";
import globals from "globals";

export default [
  js.configs.recommended,
  {
    files: ["src/multihead/render/js/**/*.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: { ...globals.browser } },
    rules: { "no-unused-vars": ["error", { args: "none" }], "prefer-const": "error", eqeqeq: ["error", "always"] },
  },
  {
    files: ["tests/js/**/*.js"],
    languageOptions: { ecmaVersion: 2022, sourceType: "module", globals: { ...globals.node } },
  },
];
