// Every page, offline: each is opened at 1280x800 and 390x844 with every request to a host other
// than this one aborted (and recorded); it renders its h1, finishes loading without an error
// state or a console error, fits 390px without horizontal scrolling, and is saved as a PNG under
// SPECDECK_ARTIFACTS/screenshots/<page>-<w>x<h>.png. /docs and /redoc render offline too.
// Runs after flow.spec.ts (files run in name order), whose job and deployment it shows.
import { expect, test, type Browser, type BrowserContext, type Page } from "@playwright/test";
import { env, readState, screenshotPath, signIn } from "./support";

const SIZES = [
  { width: 1280, height: 800 },
  { width: 390, height: 844 },
];
const LOCAL_HOSTS = new Set(["127.0.0.1", "localhost", "[::1]"]);

type StorageState = Awaited<ReturnType<BrowserContext["storageState"]>>;

interface Watched {
  page: Page;
  offHost: string[]; // requests to other hosts, all aborted
  errors: string[]; // console errors and uncaught exceptions
}

const opened: BrowserContext[] = []; // closed after each test

async function openOffline(browser: Browser, storageState?: StorageState): Promise<Watched> {
  const context = await browser.newContext({ baseURL: env("SPECDECK_URL"), storageState, viewport: SIZES[0] });
  opened.push(context);
  const offHost: string[] = [];
  await context.route(
    (url) => /^(https?|wss?):$/.test(url.protocol) && !LOCAL_HOSTS.has(url.hostname),
    (route) => {
      offHost.push(route.request().url());
      return route.abort("blockedbyclient");
    },
  );
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("console", (message) => {
    if (message.type() === "error") errors.push(`console error: ${message.text()} (${message.location().url})`);
  });
  page.on("pageerror", (error) => errors.push(`uncaught: ${error.message}`));
  return { page, offHost, errors };
}

/** Open the page at both sizes: h1, loaded, no error state, a screenshot, no overflow at 390. */
async function checkPage(watched: Watched, name: string, path: string): Promise<void> {
  const { page } = watched;
  for (const size of SIZES) {
    await test.step(`${name} at ${size.width}x${size.height}`, async () => {
      await page.setViewportSize(size);
      await page.goto(path);
      await expect(page.getByRole("heading", { level: 1 })).toBeVisible();
      await expect(page.locator(".state .spinner"), "the page finishes loading").toHaveCount(0);
      // (A drafter's verdict is a finding, not the page failing: whether the flow's job is
      // slower than no speculation is this machine's speed's to decide.)
      await expect(page.locator(".state.error:not([data-testid=verdict])"), "no error state").toHaveCount(0);
      await page.screenshot({ path: screenshotPath(name, size.width, size.height), fullPage: true });
      if (size.width <= 390) {
        const width = await page.evaluate(() => document.scrollingElement!.scrollWidth);
        expect(width, `${name} has no horizontal overflow at ${size.width}px`).toBeLessThanOrEqual(size.width + 1);
      }
    });
  }
  expect(watched.offHost, "requests to other hosts").toEqual([]);
  expect(watched.errors, "console errors").toEqual([]);
}

/** The first link in a list page's table to a path that starts with `prefix`. */
async function firstLinkIn(page: Page, listPath: string, table: string, prefix: string): Promise<string | null> {
  await page.goto(listPath);
  const links = page.getByRole("table", { name: table }).locator(`a[href^="${prefix}"]`);
  await links
    .first()
    .waitFor({ timeout: 60_000 })
    .catch(() => {});
  return (await links.count()) ? await links.first().getAttribute("href") : null;
}

// Pages that are there when signed in; a function resolves a path that needs an id.
const PAGES: { name: string; path: string | ((page: Page) => Promise<string | null>) }[] = [
  { name: "jobs", path: "/jobs" },
  { name: "new-job", path: "/jobs/new" },
  {
    name: "job-detail",
    path: async (page) => {
      const { jobId } = readState();
      return jobId ? `/jobs/${jobId}` : firstLinkIn(page, "/jobs", "Jobs", "/jobs/job_");
    },
  },
  { name: "deployments", path: "/deployments" },
  { name: "new-deployment", path: "/deployments/new" },
  {
    name: "deployment-detail",
    path: async (page) => {
      const { deploymentId } = readState();
      return deploymentId ? `/deployments/${deploymentId}` : firstLinkIn(page, "/deployments", "Deployments", "/deployments/dep_");
    },
  },
  { name: "playground", path: "/playground" },
  { name: "datasets", path: "/datasets" },
  { name: "settings", path: "/settings" },
  { name: "workers", path: "/workers" },
];

test.describe("every page, offline", () => {
  let signedIn: StorageState;

  test.afterEach(async () => {
    await Promise.all(opened.splice(0).map((context) => context.close()));
  });

  test.beforeAll(async ({ browser }) => {
    // flow.spec.ts revokes SPECDECK_KEY at its end and leaves the key it made instead.
    const key = readState().key ?? env("SPECDECK_KEY");
    const context = await browser.newContext({ baseURL: env("SPECDECK_URL") });
    await signIn(await context.newPage(), key, { remember: true });
    signedIn = await context.storageState();
    await context.close();
  });

  test("sign-in", async ({ browser }) => {
    const watched = await openOffline(browser);
    await checkPage(watched, "sign-in", "/sign-in");
    await expect(watched.page.getByLabel("API key", { exact: true })).toBeVisible();
  });

  for (const { name, path } of PAGES) {
    test(name, async ({ browser }) => {
      const watched = await openOffline(browser, signedIn);
        const resolved = typeof path === "string" ? path : await path(watched.page);
      if (name === "deployment-detail") test.skip(!resolved, "no deployment exists");
      expect(resolved, `a ${name} page to show (flow.spec.ts makes one)`).toBeTruthy();
      await checkPage(watched, name, resolved!);
    });
  }

  test("/docs and /redoc", async ({ browser }) => {
    const { page, offHost } = await openOffline(browser);
    await page.goto("/docs");
    await expect(page.locator(".swagger-ui .opblock").first()).toBeVisible();
    expect(await page.locator(".swagger-ui .opblock").count()).toBeGreaterThan(10);
    await page.goto("/redoc");
    await expect(page.getByRole("heading", { level: 1, name: /SpecDeck/ })).toBeVisible();
    await expect(page.locator(".menu-content")).toBeVisible();
    expect(offHost, "requests to other hosts").toEqual([]);
  });
});
