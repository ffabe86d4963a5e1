import { defineConfig } from "vite";
import react from "@vitejs/plugin-react";

// `npm run dev` proxies the API to a `specdeck api` on :8000 (SPECDECK_API to change it);
// the production build is served by the API itself at /.
const api = process.env.SPECDECK_API ?? "http://127.0.0.1:8000";

export default defineConfig({
  plugins: [react()],
  build: { outDir: "dist", sourcemap: false, chunkSizeWarningLimit: 1500 },
  server: { proxy: { "/api": api, "/v1": api, "/healthz": api } },
});
