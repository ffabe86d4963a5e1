// Query keys of the deployment page; ["deployment", id] alone is the deployment.
export const keys = {
  deployment: (id: string) => ["deployment", id] as const,
  events: (id: string) => ["deployment-events", id] as const,
  live: (id: string) => ["deployment-metrics", id] as const,
  promotions: (id: string) => ["deployment-promotions", id] as const,
};
