import type { ReactNode } from "react";
import { Navigate, NavLink, Route, Routes, useLocation } from "react-router-dom";
import { useAuth } from "./auth";
import SignIn from "./pages/SignIn";
import Jobs from "./pages/Jobs";
import NewJob from "./pages/NewJob";
import JobCompare from "./pages/JobCompare";
import JobDetail from "./pages/JobDetail";
import Deployments from "./pages/Deployments";
import NewDeployment from "./pages/NewDeployment";
import DeploymentDetail from "./pages/DeploymentDetail";
import Playground from "./pages/Playground";
import Datasets from "./pages/Datasets";
import Settings from "./pages/Settings";
import Workers from "./pages/Workers";

const NAV = [
  ["/jobs", "Jobs"],
  ["/deployments", "Deployments"],
  ["/playground", "Playground"],
  ["/datasets", "Datasets"],
  ["/workers", "Workers"],
  ["/settings", "Settings"],
] as const;

function Shell({ children }: { children: ReactNode }) {
  const { identity, signOut } = useAuth();
  return (
    <div className="shell">
      <a href="#main" className="skip">
        Skip to content
      </a>
      <header className="top">
        <NavLink to="/jobs" className="brand">
          SpecDeck
        </NavLink>
        <nav aria-label="Main">
          {NAV.map(([to, label]) => (
            <NavLink key={to} to={to}>
              {label}
            </NavLink>
          ))}
        </nav>
        <div className="who">
          {identity && (
            <span title={`Key ${identity.key.name || identity.key.prefix}`}>
              Project <strong data-testid="project-name">{identity.project.name}</strong>
            </span>
          )}
          <button type="button" className="small" onClick={signOut}>
            Sign out
          </button>
        </div>
      </header>
      <main id="main" tabIndex={-1}>
        {children}
      </main>
    </div>
  );
}

function Private({ children }: { children: ReactNode }) {
  const { key } = useAuth();
  const location = useLocation();
  if (!key) return <Navigate to="/sign-in" replace state={{ from: location.pathname }} />;
  return <Shell>{children}</Shell>;
}

export default function App() {
  const page = (element: ReactNode) => <Private>{element}</Private>;
  return (
    <Routes>
      <Route path="/sign-in" element={<SignIn />} />
      <Route path="/" element={<Navigate to="/jobs" replace />} />
      <Route path="/jobs" element={page(<Jobs />)} />
      <Route path="/jobs/new" element={page(<NewJob />)} />
      <Route path="/jobs/compare" element={page(<JobCompare />)} />
      <Route path="/jobs/:jobId" element={page(<JobDetail />)} />
      <Route path="/deployments" element={page(<Deployments />)} />
      <Route path="/deployments/new" element={page(<NewDeployment />)} />
      <Route path="/deployments/:deploymentId" element={page(<DeploymentDetail />)} />
      <Route path="/playground" element={page(<Playground />)} />
      <Route path="/datasets" element={page(<Datasets />)} />
      <Route path="/workers" element={page(<Workers />)} />
      <Route path="/settings" element={page(<Settings />)} />
      <Route path="*" element={page(<p className="state">No such page.</p>)} />
    </Routes>
  );
}
